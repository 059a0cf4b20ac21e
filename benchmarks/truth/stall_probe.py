"""Who holds the client's core when the vLLM truth sends late or holds a stream back (issue 26).

``python -m benchmarks.truth.stall_probe --workload W [--before B] [--runs 2] [overrides ...]`` runs
the real bench (``backend=vllm``) in a child process per repeat, which starts one vLLM server as the
campaign's ``served()`` does and replays ``--before`` (e.g. a 96-request burst), then ``W``, on it.
Meanwhile the kernel traces every context switch (ftrace ``sched_switch``/``sched_wakeup`` on the
monotonic clock, i.e. ``perf_counter``; needs root; tracefs is mounted if it is not) or, with
``--tracer proc``, ``/proc/<pid>/task/*/stat`` of the client, API server, engine core and worker is
sampled every ``--interval-ms`` (it costs the client's core itself: it disturbs what it measures).
Each late send (``arrival_error_s`` > 2 ms; a clump released together is one) and each held-back
burst (token gaps < 1 ms) is lined up with the trace and printed: the replay thread's and the other
client threads' time running / runnable (waiting for a CPU) / asleep, who ran on each core, and
totals; with the cgroup throttling counters, steal time, load average and foreign CPU. The server
now starts in the client's session (one autogroup: the fix this probe found); ``--new-session``
starts it in a session of its own as before, to see the stalls again. Other fixes to try:
``--server-group-nice 19``, ``--pin-server 1``. Each repeat writes
``<root>/stall_probe/<tag>-<i>/probe.json``; findings: ``benchmarks/results/truth_stalls.md``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd

TRACE = Path("/sys/kernel/tracing")
LATE_S, BURST_S = 0.002, 0.001
SWITCH = re.compile(
    r"\[(\d+)\]\s+\S+\s+([\d.]+): sched_switch: prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ "
    r"prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)"
)
WAKE = re.compile(r"\s([\d.]+): sched_wakeup: comm=(.*?) pid=(\d+) ")
FTRACE_ON = (
    ("tracing_on", "0"),
    ("trace", ""),
    ("trace_clock", "mono"),
    ("buffer_size_kb", "32768"),
    ("saved_cmdlines_size", "8192"),
    ("options/record-tgid", "1"),
    ("events/sched/sched_switch/enable", "1"),
    ("events/sched/sched_wakeup/enable", "1"),
    ("tracing_on", "1"),
)


def cpu_counters() -> dict[str, Any]:
    """cgroup CPU throttling and quota (v2 or v1), steal seconds and the load average, now."""
    out: dict[str, Any] = {"loadavg": Path("/proc/loadavg").read_text().split()[:3]}
    for stat in (Path("/sys/fs/cgroup/cpu.stat"), Path("/sys/fs/cgroup/cpu/cpu.stat")):
        if stat.is_file():
            out["cgroup"] = {k: int(v) for k, v in (ln.split() for ln in stat.open())}
            break
    for quota in (Path("/sys/fs/cgroup/cpu.max"), Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")):
        if quota.is_file():
            out["quota"] = quota.read_text().strip()
            break
    cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    out["steal_s"] = int(cpu[8]) / os.sysconf("SC_CLK_TCK")
    return out


def _tree(root: int) -> dict[int, str]:
    """pid → label (client, api_server, engine_core, worker or the name) of ``root``'s tree."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            if d.name.isdigit():
                ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[1]
                kids[int(ppid)].append(int(d.name))
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        out[pid] = (
            "client"
            if pid == root
            else "api_server"
            if "api_server" in cmd
            else "engine_core"
            if "EngineCor" in comm
            else "worker"
            if "Worker" in comm
            else comm
        )
        todo += kids.get(pid, [])
    return out


class Watcher(threading.Thread):
    """Labels the child's process tree every 2 s (a /proc scan costs ~10 ms of CPU), applies a
    fix to the server's processes, and with ``sample_s`` samples each task's state and CPU."""

    def __init__(self, root: int, args: argparse.Namespace) -> None:
        super().__init__(daemon=True)
        self.root, self.args = root, args
        self.pin = {int(c) for c in args.pin_server.split(",")} if args.pin_server else None
        self.sample_s = args.interval_ms / 1000 if args.tracer == "proc" else None
        self.labels: dict[int, str] = {}
        self.samples: list[tuple[float, int, int, str, int]] = []  # t, tid, tgid, state, cpu
        self.stop = threading.Event()

    def run(self) -> None:
        last = 0.0
        while not self.stop.is_set():
            if (now := time.perf_counter()) - last > 2.0:
                last = now
                self.labels.update(_tree(self.root))
                self._fix()
            if self.sample_s is None:
                time.sleep(0.5)
                continue
            for pid in list(self.labels):
                for task in Path(f"/proc/{pid}/task").glob("*"):
                    with contextlib.suppress(OSError):
                        f = (task / "stat").read_text().rsplit(")", 1)[1].split()
                        self.samples.append((now, int(task.name), pid, f[0], int(f[36])))
            time.sleep(self.sample_s)

    def _fix(self) -> None:
        for pid, label in self.labels.items():
            if label == "client":
                continue
            with contextlib.suppress(OSError):
                if self.args.server_group_nice is not None:
                    Path(f"/proc/{pid}/autogroup").write_text(str(self.args.server_group_nice))
            pin = self.pin
            for task in Path(f"/proc/{pid}/task").glob("*") if pin else ():
                with contextlib.suppress(OSError):
                    if pin and os.sched_getaffinity(int(task.name)) - pin:
                        os.sched_setaffinity(int(task.name), pin)


def child(args: argparse.Namespace) -> None:
    """In the replaying process: start one server as ``served()`` does, run the stage on each
    workload against it, and append each replay's origin (``perf_counter`` at time 0)."""
    import dataclasses

    from hydra import compose, initialize_config_dir

    from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
    from gpu_simulate_test.config.backends import VllmBackendConfig, as_engine
    from gpu_simulate_test.config.real_bench import RealBenchStageConfig
    from gpu_simulate_test.config.registry import to_resolved, to_typed
    from gpu_simulate_test.core.engines import records
    from gpu_simulate_test.core.engines.vllm import VllmBackend
    from gpu_simulate_test.real_bench.stage import run

    origins: list[float] = []

    def set_origin(self: records.Recorder, value: float) -> None:
        self.__dict__["_origin"] = value
        origins.append(value)

    records.Recorder.origin = property(lambda s: s.__dict__["_origin"], set_origin)  # type: ignore[assignment]
    if args.new_session:  # as before the fix: the server in a session (an autogroup) of its own
        real_init = subprocess.Popen.__init__

        def popen(self: subprocess.Popen[bytes], *a: Any, **kw: Any) -> None:
            if kw.pop("process_group", None) == 0:
                kw["start_new_session"] = True
            real_init(self, *a, **kw)

        subprocess.Popen.__init__ = popen  # type: ignore[assignment, method-assign]
    if args.torch_first:  # as the campaign's profiling: torch's thread pool made in this process
        import torch

        x = torch.randn(256, 256)
        for _ in range(int(args.torch_first * 200)):
            x = torch.tanh(x @ x)
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfgs = [
            compose(
                "real_bench", overrides=[f"workload_dir={w}", f"output.run_id={r}", *args.override]
            )
            for w, r in zip(args.workloads, args.run_ids, strict=True)
        ]
    typed = [to_typed(c, RealBenchStageConfig) for c in cfgs]
    server = VllmBackend(typed[0])
    server.check([])
    server.log_dir = Path(args.origin_file).parent
    server.start_server()
    try:
        for cfg, t in zip(cfgs, typed, strict=True):
            knobs = as_engine(t.backend, VllmBackendConfig)
            at = dataclasses.replace(knobs.server, kind="external", log_file=str(server.log_path))
            b = dataclasses.replace(
                knobs, base_url=server.base_url, server=at, served_model_name=t.model.name
            )
            n = len(origins)
            run(dataclasses.replace(t, backend=b), to_resolved(cfg, t))
            with open(args.origin_file, "a") as f:
                f.write(f"{origins[-1] if len(origins) > n else 'nan'}\n")
    finally:
        server.stop_server()


def parse_ftrace(text: str) -> tuple[dict[int, list[tuple[float, float, int]]], dict, dict]:
    """Per CPU the (start, end, tid) stretches it ran; per tid its state changes; tid → comm."""
    segs: dict[int, list[tuple[float, float, int]]] = collections.defaultdict(list)
    cur: dict[int, tuple[int, float]] = {}
    states: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
    comms: dict[int, str] = {0: "idle"}
    for line in text.splitlines():
        if m := SWITCH.search(line):
            cpu, t, pcomm, prev, pstate, ncomm, nxt = m.groups()
            c, at, p, n = int(cpu), float(t), int(prev), int(nxt)
            if c in cur:
                segs[c].append((cur[c][1], at, cur[c][0]))
            cur[c] = (n, at)
            comms[p], comms[n] = pcomm, ncomm
            states[p].append((at, "runnable" if pstate.startswith("R") else "sleep"))
            states[n].append((at, "run"))
        elif m := WAKE.search(line):
            states[int(m.group(3))].append((float(m.group(1)), "runnable"))
    return segs, states, comms


def overlap(a: float, b: float, c: float, d: float) -> float:
    """Length of [a, b] ∩ [c, d]."""
    return max(0.0, min(b, d) - max(a, c))


def stall_windows(run_dir: Path, origin: float) -> list[dict[str, Any]]:
    """Late sends (a clump released together is one) and held-back bursts (from the token before
    the burst to its release), in ``perf_counter`` seconds."""
    req = pd.read_csv(run_dir / "request_metrics.csv")
    late = req[req["arrival_error_s"] > LATE_S]
    out = [
        {
            "kind": "late",
            "n": len(g),
            "start": float(origin + g.scheduled_arrival_time_s.min()),
            "end": float(origin + g.arrival_time_s.max()),
        }
        for _, g in late.groupby((late["arrival_time_s"] * 1000).round())
    ]
    held: dict[int, dict[str, Any]] = {}
    tok = pd.read_csv(run_dir / "token_metrics.csv").sort_values(["request_id", "time_s"])
    for _, g in tok.groupby("request_id"):
        t, gap = g["time_s"].to_numpy(), g["itl_s"].to_numpy()
        for k in range(2, len(t)):
            if gap[k] < BURST_S <= gap[k - 1]:  # token k-1 was released with token k
                w = held.setdefault(
                    round(t[k - 1] * 1000),
                    {"kind": "held", "n": 0, "start": 0.0, "end": float(origin + t[k - 1])},
                )
                w["n"] += 1
                w["start"] = max(w["start"], float(origin + t[k - 2]))
    return out + sorted(held.values(), key=lambda w: w["start"])


def analyse(
    run_dir: Path,
    origin: float,
    client: int,
    labels: dict[int, str],
    trace: str | None,
    samples: list[tuple[float, int, int, str, int]],
) -> dict[str, Any]:
    """Each stall with who ran (ftrace: ms; proc: samples in state R) on which CPU, the client
    threads' states, and the totals over all stalls."""
    tgids = {tid: tgid for _t, tid, tgid, _s, _c in samples}
    segs, states, comms = parse_ftrace(trace) if trace is not None else ({}, {}, {})
    if trace is not None:
        tgids.update(tuple(map(int, ln.split())) for ln in (TRACE / "saved_tgids").open())  # type: ignore[misc]
    labels = {**labels, os.getpid(): "probe"}

    def label_of(tid: int) -> str:
        return "idle" if tid == 0 else labels.get(tgids.get(tid, -1), "other")

    totals: collections.defaultdict[str, float] = collections.defaultdict(float)
    windows = stall_windows(run_dir, origin)
    for w in windows:
        a, b = w["start"], w["end"]
        held: collections.defaultdict[str, float] = collections.defaultdict(float)
        for cpu, lst in segs.items():
            for s, e, tid in lst:
                if (ov := overlap(a, b, s, e)) > 0:
                    held[f"cpu{cpu} {label_of(tid)}/{comms.get(tid, tid)}"] += ov * 1000
        for t, tid, _g, st, cpu in samples:
            if st == "R" and a <= t <= b:
                held[f"cpu{cpu} {label_of(tid)}"] += 1
        w["holders"] = {k: round(v, 2) for k, v in sorted(held.items(), key=lambda kv: -kv[1])}
        for tid, ev in states.items():
            if label_of(tid) == "client":
                who = w.setdefault("replay" if tid == client else "client_other", {})
                for (s, st), (e, _) in zip(ev, [*ev[1:], (b, "")], strict=True):
                    who[st] = round(who.get(st, 0.0) + overlap(a, b, s, e) * 1000, 2)
        for k, v in [
            *w["holders"].items(),
            *((f"{x} {s}", v) for x in ("replay", "client_other") for s, v in w.get(x, {}).items()),
        ]:
            totals[f"{w['kind']} {k}"] += v
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:30]
    return {"windows": windows, "totals": {k: round(v) for k, v in top}}


def summarise(run_dir: Path) -> dict[str, Any]:
    """The run's own figures: arrival error, token gaps, verdict, CPU by process, engine step."""
    req = pd.read_csv(run_dir / "request_metrics.csv")
    gaps = pd.read_csv(run_dir / "token_metrics.csv")["itl_s"].dropna()
    steps = pd.read_csv(run_dir / "engine_step_log.csv")["elapsed_ms"]
    meta = json.loads((run_dir / "run_meta.json").read_text())
    d = meta.get("disturbance") or {}
    err = req["arrival_error_s"] * 1000
    return {
        "late_p99_ms": round(err.quantile(0.99), 2),
        "late_max_ms": round(err.max(), 2),
        "late_sends": int((err > LATE_S * 1000).sum()),
        "gaps_lt_1ms_pct": round(100 * float((gaps < BURST_S).mean()), 2),
        "step_median_ms": round(float(steps.median()), 2),
        "disturbed": d.get("disturbed"),
        "foreign_cores": round((d.get("signs", {}).get("foreign_cpu") or {}).get("figure") or 0, 3),
        "cores": meta.get("cpu_cores_by_process"),
        "client_wait_s": meta.get("client_run_queue_wait_s"),
    }


def probe(args: argparse.Namespace, i: int) -> dict[str, Any]:
    """One repeat: run the child under the trace, then line the stalls up with it."""
    rid = f"{args.tag}-{i}"
    wl, ids = [args.workload], [rid]
    if args.before:
        wl, ids = [args.before, *wl], [f"{rid}-before", *ids]
    origin_file = Path(args.root) / "stall_probe" / rid / "origins.txt"
    origin_file.parent.mkdir(parents=True, exist_ok=True)
    origin_file.unlink(missing_ok=True)
    base = ["backend=vllm", "model=qwen3_tiny", "hardware=cpu", f"output.root={args.root}"]
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.truth.stall_probe",
        "--workload",
        args.workload,
        "--child",
        "--origin-file",
        str(origin_file),
        "--torch-first",
        str(args.torch_first),
        *(["--new-session"] if args.new_session else []),
        "--workloads",
        *wl,
        "--run-ids",
        *ids,
        "--",
        *base,
        *args.override,
    ]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL)
    watcher = Watcher(proc.pid, args)
    watcher.start()
    before = cpu_counters()
    if args.tracer == "ftrace" and not (TRACE / "trace").exists():  # tracefs not mounted yet
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACE)], check=True)
    for name, value in FTRACE_ON if args.tracer == "ftrace" else ():
        (TRACE / name).write_text(value)
    try:
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        watcher.stop.set()
        watcher.join()
    trace = None
    if args.tracer == "ftrace":
        (TRACE / "tracing_on").write_text("0")
        trace = (TRACE / "trace").read_text()
    after = cpu_counters()
    origin = float(origin_file.read_text().split()[-1])
    run_dir = Path(args.root) / "real_bench" / rid
    res = {
        "run": rid,
        "args": vars(args),
        **summarise(run_dir),
        "throttled": {
            k: v - before.get("cgroup", {}).get(k, 0) for k, v in after.get("cgroup", {}).items()
        },
        "quota": after.get("quota"),
        "steal_s": round(after["steal_s"] - before["steal_s"], 2),
        "loadavg": [before["loadavg"][0], after["loadavg"][0]],
        **analyse(run_dir, origin, proc.pid, watcher.labels, trace, watcher.samples),
    }
    (origin_file.parent / "probe.json").write_text(json.dumps(res, indent=1, default=str))
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--workload", required=True, help="the workload dir whose replay is probed")
    p.add_argument("--before", help="a workload replayed first on the same server (a burst)")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--root", default="tmp/probe", help="output.root of the runs")
    p.add_argument("--tag", default="probe", help="run ids are <tag>-<i>")
    p.add_argument("--tracer", choices=("ftrace", "proc"), default="ftrace")
    p.add_argument("--interval-ms", type=float, default=3.0, help="the proc tracer's period")
    p.add_argument("--pin-server", help="fix: bind the server's threads to these CPUs, e.g. 1")
    p.add_argument("--server-group-nice", type=int, help="fix: the server's autogroup nice")
    p.add_argument(
        "--new-session",
        action="store_true",
        help="as before the fix: the server in a session (an autogroup) of its own",
    )
    p.add_argument(
        "--torch-first",
        type=float,
        default=0.0,
        help="seconds of torch matmuls in the client first (as the campaign)",
    )
    p.add_argument("--show", type=int, default=6, help="stalls printed per run")
    p.add_argument("override", nargs="*", help="more real_bench overrides")
    for hidden in ("--workloads", "--run-ids"):
        p.add_argument(hidden, nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--origin-file", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    for i in range(args.runs):
        r = probe(args, i)
        print(
            f"== {r['run']}: late p99 {r['late_p99_ms']} ms, max {r['late_max_ms']} ms "
            f"({r['late_sends']} late); token gaps < 1 ms {r['gaps_lt_1ms_pct']}%; step median "
            f"{r['step_median_ms']} ms; disturbed {r['disturbed']}; foreign {r['foreign_cores']}"
            f" cores; throttled {r['throttled']} (quota {r['quota']}); steal {r['steal_s']} s; "
            f"load {r['loadavg']}; cores {r['cores']}; client wait {r['client_wait_s']} s"
        )
        for w in sorted(r["windows"], key=lambda w: w["start"] - w["end"])[: args.show]:
            top = ", ".join(f"{k} {v:g}" for k, v in list(w["holders"].items())[:6])
            print(
                f"  {w['kind']} x{w['n']} {1000 * (w['end'] - w['start']):.1f} ms: replay "
                f"{w.get('replay')}, other client threads {w.get('client_other')}; {top}"
            )
        print("  totals (ms):", ", ".join(f"{k} {v}" for k, v in list(r["totals"].items())[:14]))


if __name__ == "__main__":
    main()
