"""What an idle vLLM server costs the host while another one is measured.

The tune's check (``tune.verify=top_k``) starts the checked configurations' servers together
(``tune.servers_at_once``) before the first of them is measured, so each is measured while the
others wait, up and idle. That is only sound if an idle server takes no core: this starts one
server (the ``vllm`` backend's knobs, tiny Qwen3), lets it settle, and reads the CPU seconds its
whole process tree (API server, engine core, worker) spends over a window, per process, as a
share of one core. vLLM's worker waits on its shared-memory queue by polling a socket once it
has been idle for a moment, its engine core blocks on its input queue, and the API server's
event loop sleeps; still, on 2026-11-28 an idle server took 1.6% of a core, its worker most of
it (``results/tune_20261128d/idle_server.json``), which is why the tune pauses the servers that
wait their turn (SIGSTOP) rather than leaving them idle.

Run: ``python -m benchmarks.truth.idle_server [--settle 20] [--window 30] [--out F.json]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.truth.served import served_vllm


def tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and every descendant."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, tuple[str, float]]:
    """Per process: its name and the user + system CPU seconds it has spent."""
    out = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
            out[proc.pid] = (proc.name(), times.user + times.system)
        except psutil.NoSuchProcess:
            continue
    return out


def server_pid(base_url: str) -> int:
    """The pid of the process listening on ``base_url``'s port."""
    port = int(base_url.rsplit(":", 1)[1])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == "LISTEN" and conn.pid:
            return int(conn.pid)
    raise SystemExit(f"idle_server: nothing listens on {base_url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settle", type=float, default=20.0, help="seconds idle before reading")
    parser.add_argument("--window", type=float, default=30.0, help="seconds read")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="idle-server-") as root, served_vllm(Path(root)) as s:
        time.sleep(args.settle)
        procs = tree(server_pid(s.base_url))
        before = cpu_seconds(procs)
        t0 = time.perf_counter()
        time.sleep(args.window)
        after = cpu_seconds(procs)
        window = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    for pid, (name, spent) in after.items():
        if pid in before:
            share = (spent - before[pid][1]) / window
            rows.append({"pid": pid, "process": name, "core_share": round(share, 5)})
    total = sum(r["core_share"] for r in rows)
    for row in rows:
        print(f"{row['process']:>28}  {row['core_share']:.3%} of a core")
    print(f"{'the idle server':>28}  {total:.3%} of a core over {window:.0f} s "
          f"(after {args.settle:.0f} s idle)")  # fmt: skip
    if args.out:
        record = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "device": "cpu",
            "python": platform.python_version(),
            "cpus": psutil.cpu_count(),
            "vllm": s.vllm_version,
            "command": "python -m benchmarks.truth.idle_server "
            f"--settle {args.settle:g} --window {args.window:g}",
            "window_s": round(window, 1),
            "processes": rows,
            "total_core_share": round(total, 5),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
