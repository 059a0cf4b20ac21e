"""Per-step diagnosis of the hf_cb engine under load: measured step time next to the calibration.

The fidelity harness compares request latencies; this looks one level down, at the engine's
steps. It replays a seeded Poisson workload through the real bench's ``hf_cb`` backend (the same
harness and knobs as the bench), times every step of the engine (``prepare_next_batch`` +
``_generation_step`` + ``update_batch`` of transformers' batch processor, wrapped in place) with
what was in it, and prints, per number of requests in the step, the median measured time beside
the step time the bundle's engine calibration measured for a decode batch of that size.

    python -m benchmarks.calibration.step_times          # tiny Qwen3 on CPU, cap 8
    python -m benchmarks.calibration.step_times --bundle tmp/profiles/cpu/qwen3_tiny \
        --out step_times.md

Needs transformers' continuous-batching internals (5.x); exits with a message otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.engine_steps import bench_config
from gpu_simulate_test.config.backends import HfCbBackendConfig
from gpu_simulate_test.config.presets import hardware_preset, model_preset
from gpu_simulate_test.config.vidur import EngineCalibrationConfig
from gpu_simulate_test.core.engines import get_backend
from gpu_simulate_test.core.engines.harness import replay, switch_interval
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.core.profiling.bundle import load_bundle
from gpu_simulate_test.core.reporting import markdown_table


def is_prefill(future_state: Any) -> bool:
    """More than one query token this step (the scheduler marks a prompt's last chunk DECODING
    before the step runs, so the status cannot tell)."""
    return int(getattr(future_state, "query_length", 1)) > 1


def workload(n: int, qps: float, seed: int, vocab: int) -> list[BenchRequest]:
    """cpu_tiny's length mix (prompts 16–64, outputs 4–16), Poisson arrivals."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / qps, n))
    prompts, outputs = rng.integers(16, 65, n), rng.integers(4, 17, n)
    return [
        BenchRequest(
            request_id=i,
            num_prefill_tokens=int(p),
            num_decode_tokens=int(d),
            scheduled_arrival_s=float(a - arrivals[0]),
            prompt_token_ids=tuple(int(t) for t in rng.integers(0, min(vocab, 30_000), int(p))),
        )
        for i, (p, d, a) in enumerate(zip(prompts, outputs, arrivals, strict=True))
    ]


def instrument(processor: Any, log: list[tuple[int, int, float]]) -> None:
    """Wrap the batch processor's three step phases; each step logs (requests, prefills, ms)."""
    prepare, generate, update = (
        processor.prepare_next_batch,
        processor._generation_step,
        processor.update_batch,
    )
    state: dict[str, Any] = {}

    def timed_prepare() -> Any:
        state["start"] = time.perf_counter()
        return prepare()

    def counted_generate(model: Any) -> None:
        batch = processor.inputs_and_outputs.requests_in_batch
        state["requests"] = len(batch)
        state["prefills"] = sum(1 for fs in batch if is_prefill(fs))
        generate(model)

    def timed_update() -> Any:
        out = update()
        if "start" in state:
            elapsed = (time.perf_counter() - state["start"]) * 1e3
            log.append((state.get("requests", 0), state.get("prefills", 0), elapsed))
        return out

    processor.prepare_next_batch = timed_prepare
    processor._generation_step = counted_generate
    processor.update_batch = timed_update


def table(log: list[tuple[int, int, float]], calibrated: dict[int, float]) -> pd.DataFrame:
    steps = pd.DataFrame(log[1:], columns=["requests", "prefills", "ms"])  # first: warm-up edge
    rows = []
    with_prefill_mask = steps["prefills"] > 0
    combos = [(int(n), p) for n in sorted(steps["requests"].unique()) for p in (False, True)]
    for n, with_prefill in combos:
        group = steps[(steps["requests"] == n) & (with_prefill_mask == with_prefill)]
        if group.empty:
            continue
        cal = calibrated.get(n, float("nan"))
        median = float(group["ms"].median())
        rows.append(
            {
                "requests": n,
                "kind": "with a prefill" if with_prefill else "decode only",
                "steps": len(group),
                "measured_ms_p50": round(median, 2),
                "measured_ms_p90": round(float(group["ms"].quantile(0.9)), 2),
                "calibrated_decode_ms": round(cal, 2),
                "measured_vs_calibrated": f"{median / cal - 1:+.1%}" if cal == cal else "–",
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3_tiny")
    parser.add_argument("--hardware", default="cpu")
    parser.add_argument("--qps", type=float, default=20.0)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-batch-tokens", type=int, default=256)
    parser.add_argument("--max-requests", type=int, default=8)
    parser.add_argument("--num-blocks", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bundle", default=None, help="a bundle with an hf_cb calibration")
    parser.add_argument("--out", default=None, help="also write the table as markdown here")
    args = parser.parse_args(argv)

    calibrated: dict[int, float] = {}
    if args.bundle:
        rows = load_bundle(args.bundle).engine_steps("hf_cb")
        decode = rows[rows["phase"] == "decode"]
        calibrated = dict(zip(decode["batch_size"].astype(int), decode["step_ms"], strict=True))
    backend_cfg = HfCbBackendConfig(
        max_num_batched_tokens=args.max_batch_tokens,
        max_num_seqs=args.max_requests,
        num_gpu_blocks_override=args.num_blocks,
    )
    model, hardware = model_preset(args.model), hardware_preset(args.hardware)
    cfg = bench_config(EngineCalibrationConfig(backend=backend_cfg), model, hardware, "auto")
    requests = workload(args.requests, args.qps, args.seed, model.vocab_size)
    backend: Any = get_backend("hf_cb")(cfg)
    recorder = Recorder(requests)
    log: list[tuple[int, int, float]] = []
    try:
        backend.start(recorder)
        backend.warmup(requests[:2])
        processor = getattr(backend.manager, "batch_processor", None)
        if processor is None or not hasattr(processor, "update_batch"):
            sys.exit("this transformers version has no batch processor to instrument")
        instrument(processor, log)
        with switch_interval(backend_cfg.gil_switch_interval_s):
            replay(backend, requests, recorder, backend_cfg.request_timeout_s)
    finally:
        backend.close()
    result = table(log, calibrated)
    text = markdown_table(
        [str(c) for c in result.columns],
        [[str(v) for v in rec] for rec in result.itertuples(index=False)],
    )
    header = (
        f"hf_cb, {args.model} on {args.hardware}, {args.requests} requests at {args.qps:g} req/s "
        f"(Poisson, seed {args.seed}), {args.max_batch_tokens} tokens / {args.max_requests} "
        f"requests per batch: {len(log) - 1} steps"
    )
    print(header)
    print(text)
    if args.out:
        Path(args.out).write_text(f"{header}\n\n{text}\n")
    return result


if __name__ == "__main__":
    main()
