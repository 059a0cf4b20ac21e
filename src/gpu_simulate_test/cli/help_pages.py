"""Each stage's ``--help`` page (:class:`~gpu_simulate_test.cli.help_text.StageHelp`): what it
does, commands copied from README.md and docs/<stage>.md, where it writes, its main knobs.

The knobs' values are the composed configs' defaults, checked by tests/unit/cli/test_help.py: a
changed default in a YAML file or a schema fails that test until the page says it too. Knobs a
stage sets at run time are :func:`~gpu_simulate_test.cli.help_text.derived`, naming their source.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpu_simulate_test.cli.help_text import Example, StageHelp, derived, knob, required

__all__ = ("STAGE_HELP",)

M = "python -m gpu_simulate_test.cli"
RUN_ID = knob("output.run_id", "null", "null: <UTC time>-<config id>-<random>")
TINY_CPU = (("model", "qwen3_tiny"), ("hardware", "cpu"))
SCHEDULER = derived(
    "vidur.scheduler.name",
    ("backend.name",),
    "vllm -> vllm_v1, hf_cb -> sarathi, hf_generate -> cap 1",
)
CHUNK = derived("vidur.scheduler.chunk_size", ("backend.max_num_batched_tokens",), "the same value")
CAP = derived("vidur.scheduler.batch_size_cap", ("backend.max_num_seqs",), "the same value")

WORKLOAD = StageHelp(
    purpose=(
        "builds the requests the real bench and the simulator replay: who arrives",
        "when, with how many prompt tokens, asking for how many output tokens.",
    ),
    examples=(
        Example(f"{M}.workload output.run_id=demo", "64 requests, Poisson, 2 req/s"),
        Example(
            f"{M}.workload workload.num_requests=500 workload.qps=8",
            "bursty arrivals",
            more="workload.arrival.process=gamma workload.arrival.burstiness=0.5",
        ),
        Example(f"{M}.workload workload=shared_prefix", "shared system prompts"),
        Example(f"{M}.workload -m workload.qps=1,2,4 output.run_id=q", "runs q-0, q-1, q-2"),
    ),
    outputs=(
        "tmp/workload/<run_id>/: prompts.jsonl, trace_lengths.csv, trace_intervals.csv,",
        "  workload_meta.json (what real_bench, vidur_simulate and the others take)",
    ),
    knobs=(
        knob("workload.num_requests", "64", "requests"),
        knob("workload.qps", "2.0", "mean arrival rate (req/s)"),
        knob(
            "workload.arrival.process", "poisson", "or gamma (workload.arrival.burstiness), fixed"
        ),
        knob("workload.prompt_len.max", "256", "prompt tokens, uniform from prompt_len.min=16"),
        knob("workload.output_len.max", "64", "output tokens, uniform from output_len.min=8"),
        knob("workload.seed", "0", "the same seed gives byte-identical files"),
        RUN_ID,
    ),
    groups=(("model", "qwen3_tiny"), ("workload", "synthetic")),
    docs="docs/workloads.md",
)

VIDUR_PROFILE = StageHelp(
    purpose=(
        "times a Qwen3 decoder layer's ops on this device into the profiling bundle",
        "vidur_simulate predicts step times from; engine.enable=true also calibrates the",
        "real engine's per-step cost.",
    ),
    examples=(
        Example(f"{M}.vidur_profile", "tiny Qwen3 on this CPU, ~35 s"),
        Example(f"{M}.vidur_profile model=qwen3_0_6b hardware=h100", "on an H100, ~80 s"),
        Example(
            f"{M}.vidur_profile workload_dir=tmp/workload/demo",
            "cover a workload",
            more="output.overwrite=true",
        ),
        Example(f"{M}.vidur_profile engine.enable=true", "+ engine calibration"),
    ),
    outputs=(
        "the bundle: tmp/profiles/<hardware>/<model>/ (mlp.csv, attention.csv, meta.json;",
        "  engine_steps.csv with engine.enable=true)",
        "tmp/vidur_profile/<run_id>/run_meta.json: the run, naming its bundle",
    ),
    knobs=(
        knob("profiling_root", "tmp/profiles", "where bundles live"),
        knob("profile.max_num_tokens", "4096", "tokens per batch covered"),
        knob("profile.max_batch_size", "32", "decode batch sizes covered"),
        knob("workload_dir", "null", "a workload run: widen the ranges to cover it"),
        knob("engine.enable", "false", "also calibrate the engine (engine.backend.*)"),
        knob("block_size", "16", "KV block size; must match vidur.scheduler.block_size"),
        RUN_ID,
    ),
    groups=TINY_CPU,
    presets=(
        "profile_cpu_tiny",
        "profile_qwen3_0_6b_h100",
        "profile_qwen3_4b_h100",
        "profile_qwen3_8b_h100",
    ),
)

VIDUR_SIMULATE = StageHelp(
    purpose=(
        "replays a workload run in the Vidur simulator with a local profiling bundle and",
        "writes per-request latencies in the real bench's schema. Offline; CPU only.",
    ),
    examples=(
        Example(
            f"{M}.vidur_simulate workload_dir=tmp/workload/demo",
            "the bundle from vidur_profile",
            more="output.run_id=demo",
        ),
        Example(
            f"{M}.vidur_simulate workload_dir=tmp/workload/demo",
            "another scheduler",
            more="vidur.scheduler.name=vllm",
        ),
        Example(
            f"{M}.vidur_simulate -m workload_dir=tmp/workload/demo",
            "runs cap-0, cap-1, cap-2",
            more="vidur.scheduler.batch_size_cap=8,16,32 output.run_id=cap",
        ),
    ),
    outputs=(
        "tmp/vidur_simulate/<run_id>/: request_metrics.csv (the real bench's columns),",
        "  Vidur's raw output; reads <profiling_root>/<hardware.name>/<model.name>/",
    ),
    knobs=(
        required("workload_dir", "a workload run, e.g. tmp/workload/demo"),
        knob("profiling_root", "tmp/profiles", "where the bundle is read"),
        knob("vidur.scheduler.name", "sarathi", "or vllm_v1 (vLLM's V1), vllm, orca"),
        knob(
            "vidur.scheduler.chunk_size", "512", "tokens per step (vLLM's max_num_batched_tokens)"
        ),
        knob("vidur.scheduler.batch_size_cap", "32", "requests per step (max_num_seqs)"),
        knob("vidur.engine_overhead", "none", "an engine's calibrated per-step cost: hf_cb, vllm"),
        knob("arrivals_from", "null", "a real_bench run: simulate the sends it made"),
        RUN_ID,
    ),
    groups=TINY_CPU,
)

REAL_BENCH = StageHelp(
    purpose=(
        "replays a workload run against a real model in a real serving engine at the",
        "workload's exact arrival times, and records every request's and token's times.",
    ),
    examples=(
        Example(f"{M}.real_bench workload_dir=tmp/workload/demo", "hf_cb, in process"),
        Example(
            f"{M}.real_bench workload_dir=tmp/workload/demo",
            "a vLLM server, started and stopped here",
            more="backend=vllm",
        ),
        Example(
            f"{M}.real_bench workload_dir=tmp/workload/demo",
            "one request at a time",
            more="backend=hf_generate",
        ),
        Example(
            f"{M}.real_bench workload_dir=tmp/workload/demo",
            "Qwen3-0.6B on an H100",
            more="model=qwen3_0_6b hardware=h100",
        ),
    ),
    outputs=(
        "tmp/real_bench/<run_id>/: request_metrics.csv, token_metrics.csv, summary.json,",
        "  run_meta.json, telemetry.csv; with vLLM engine_step_log.csv, server_metrics.json",
    ),
    knobs=(
        required("workload_dir", "a workload run, e.g. tmp/workload/demo"),
        knob("backend.name", "hf_cb", "the engine: vllm, vllm_engine, hf_cb, hf_generate, openai"),
        knob("backend.max_num_batched_tokens", "256", "tokens per step"),
        knob("backend.max_num_seqs", "32", "requests per step"),
        knob("backend.num_gpu_blocks_override", "512", "KV cache blocks"),
        knob("dtype", "auto", "auto: bf16 on CUDA, fp32 on CPU"),
        knob("num_warmup_requests", "2", "run first and discarded"),
        RUN_ID,
    ),
    groups=(*TINY_CPU, ("backend", "hf_cb")),
)

COMPARE = StageHelp(
    purpose=(
        "joins a real_bench run and a vidur_simulate run of the same workload request by",
        "request: how far the simulation is from the truth (error = simulated / real - 1);",
        "or, with sweep_dirs, one report over several compare runs.",
    ),
    examples=(
        Example(
            f"{M}.compare real_run_dir=tmp/real_bench/demo",
            "real vs simulated",
            more="sim_run_dir=tmp/vidur_simulate/demo",
        ),
        Example(
            f"{M}.compare 'sweep_dirs=[tmp/compare/q-*]'",
            "a sweep report",
            more="output.run_id=q-sweep",
        ),
        Example(
            f"{M}.compare 'sweep_dirs=[tmp/compare/cap-*]'",
            "x: the batch cap",
            more="compare.sweep_x=batch_size_cap",
        ),
    ),
    outputs=(
        "tmp/compare/<run_id>/: summary.md (the verdict first), comparison.json,",
        "  cdf.png, scatter.png, error_by_length.png, steps.png",
    ),
    knobs=(
        knob("real_run_dir", "null", "a real_bench run"),
        knob("sim_run_dir", "null", "a vidur_simulate run of the same workload"),
        knob("real_repeat_dir", "null", "a second real run: the truth's own spread"),
        knob("sim_seed_dirs", "[]", "more simulations, other seeds: the simulator's own spread"),
        knob("at_level_dir", "null", "a simulation at the real run's step level: a diagnosis"),
        knob("sweep_dirs", "[]", "compare runs (globs): a sweep report instead"),
        knob("compare.sweep_x", "offered_qps", "the sweep's x: offered_qps, batch_size_cap, run"),
        knob("compare.warmup_s", "0.0", "leave out requests arriving in the first seconds"),
        knob("goodput.ttft", "null", "a goal in ms (and goodput.tpot, goodput.e2el): goodput"),
        RUN_ID,
    ),
)

PIPELINE = StageHelp(
    purpose=(
        "the whole comparison in one command: workload -> vidur_profile (reused when the",
        "bundle fits) -> real_bench (twice: the truth's own spread) -> vidur_simulate of the",
        "arrivals the real run sent -> compare.",
    ),
    examples=(
        Example("make run", "the main job: this stage, tiny Qwen3 vs vLLM"),
        Example(f"{M}.pipeline backend=hf_cb", "transformers continuous batching"),
        Example(f"{M}.pipeline +experiment=qwen3_0_6b_h100", "Qwen3-0.6B on an H100"),
        Example(f"{M}.pipeline -m workload.qps=2,4,8", "+ a sweep report", more="output.run_id=q"),
    ),
    outputs=(
        "tmp/<stage>/<run_id>/ per stage it runs; the bundle in tmp/profiles/<hw>/<model>/",
        "tmp/compare/<run_id>/summary.md: the result (tmp/latest/summary.md: the newest);",
        "  a multirun with output.run_id=q: tmp/compare/q-sweep/",
        "tmp/pipeline/<run_id>/run_meta.json: every stage's directory, the derived scheduler",
    ),
    knobs=(
        knob("backend.name", "vllm", "the truth: a vLLM server started and stopped here"),
        knob("backend.max_num_batched_tokens", "256", "vLLM's --max-num-batched-tokens"),
        knob("workload.num_requests", "40", "requests"),
        knob("workload.qps", "4.0", "mean arrival rate (req/s)"),
        knob("reuse_profile", "true", "reuse the bundle when it covers the run"),
        knob("real_repeat", "true", "run the truth twice"),
        knob("sim_seeds", "2", "simulate again with other seeds: the simulator's own spread"),
        knob("at_level", "true", "simulate again at the real run's step level (a diagnosis)"),
        SCHEDULER,
        CHUNK,
        CAP,
        RUN_ID,
    ),
    groups=(*TINY_CPU, ("workload", "synthetic"), ("backend", "vllm")),
    presets=("qwen3_0_6b_h100", "qwen3_tiny_cpu_sweep"),
)

FIDELITY = StageHelp(
    purpose=(
        "how far Vidur is from the real engine at several loads: the engine's capacity",
        "from a burst, then 20/50/85% of it, real (twice: the noise floor) and simulated.",
    ),
    examples=(
        Example(f"{M}.fidelity", "tiny Qwen3 on CPU vs vLLM, ~10 min"),
        Example(f"{M}.fidelity +experiment=fidelity_cpu_tiny", "vs transformers (hf_cb)"),
        Example(
            f"{M}.fidelity +experiment=fidelity_qwen3_0_6b_h100",
            "the real half, on an H100",
            more="fidelity.phase=real output.run_id=gpu",
        ),
        Example(
            f"{M}.fidelity fidelity.phase=sim",
            "the simulated half, anywhere",
            more="fidelity.real_from=tmp/fidelity/gpu",
        ),
    ),
    outputs=(
        "tmp/fidelity/<run_id>/: report.md, fidelity.json, fidelity.csv,",
        "  latency-vs-load-<backend>.png, every stage run under runs/",
        "a multirun with output.run_id=f: tmp/fidelity/f-combined/",
    ),
    knobs=(
        knob("fidelity.loads", "[0.2,0.5,0.85]", "fractions of the measured capacity"),
        knob("fidelity.num_requests", "64", "requests per load, at least"),
        knob("fidelity.real_repeats", "2", "real runs per load"),
        knob("fidelity.phase", "all", "or real (the GPU half), sim (from fidelity.real_from)"),
        knob("backend.name", "vllm", "the real engine"),
        knob("reuse_profile", "false", "false: profile and calibrate afresh"),
        derived(
            "workload.qps",
            ("fidelity.loads", "fidelity.capacity_qps"),
            "each load x the capacity (measured, or given)",
        ),
        SCHEDULER,
        RUN_ID,
    ),
    groups=(*TINY_CPU, ("workload", "synthetic"), ("backend", "vllm")),
    presets=(
        "fidelity_cpu_tiny",
        "fidelity_cpu_tiny_vllm",
        "fidelity_qwen3_0_6b_h100",
        "fidelity_qwen3_0_6b_vllm",
        "fidelity_qwen3_4b_h100",
        "fidelity_qwen3_8b_h100",
    ),
)

CAPACITY = StageHelp(
    purpose=(
        "the highest request rate whose simulated latency percentiles meet every goal",
        "(SLO): a grid of rates, then bisection; optionally checked on the real engine.",
    ),
    examples=(
        Example(f"{M}.capacity", "tiny Qwen3 on CPU, vLLM's knobs"),
        Example(
            f"{M}.capacity capacity.slo.ttft_ms=200 capacity.slo.tpot_ms=40",
            "other goals, a longer trace",
            more="workload.num_requests=10000 capacity.qps_max=128",
        ),
        Example(f"{M}.capacity capacity.verify=search", "+ the search on the real engine"),
        Example(
            f"{M}.capacity -m backend.max_num_seqs=8,16,32",
            "one search per batch cap",
            more="output.run_id=cap",
        ),
    ),
    outputs=(
        "tmp/capacity/<run_id>/: capacity.json, capacity.csv, capacity.png, report.md",
        "  (+ capacity_real.csv with capacity.verify=search)",
    ),
    knobs=(
        knob("capacity.slo.percentile", "90", "the percentile the goals are read at"),
        knob("capacity.slo.ttft_ms", "100.0", "TTFT goal (0: none)"),
        knob("capacity.slo.tpot_ms", "30.0", "TPOT goal (0: none)"),
        knob("capacity.qps_max", "64.0", "the grid's top rate (from capacity.qps_min=1.0)"),
        knob("capacity.verify", "false", "true: one real run at the answer; search: a real search"),
        knob("workload.num_requests", "1000", "the simulated workload"),
        derived("workload.qps", ("capacity.qps_min", "capacity.qps_max"), "set by the search"),
        SCHEDULER,
        RUN_ID,
    ),
    groups=(*TINY_CPU, ("workload", "synthetic"), ("backend", "vllm")),
    presets=(
        "capacity_cpu_tiny",
        "capacity_qwen3_0_6b_h100",
        "capacity_qwen3_4b_h100",
        "capacity_qwen3_8b_h100",
    ),
)

TUNE = StageHelp(
    purpose=(
        "the best vLLM knobs for a workload and latency goals: every configuration's",
        "capacity by simulation, ranked; the best few confirmed on real vLLM servers.",
    ),
    examples=(
        Example(f"{M}.tune", "4 x 4 x 2 vLLM knobs, tiny Qwen3, CPU"),
        Example(f"{M}.tune tune.verify=false", "simulation only: about a minute"),
        Example(
            f"{M}.tune 'tune.space.max_num_seqs=[2,8,32]'",
            "another space and goal",
            more="'tune.space.max_num_batched_tokens=32:512:x4' capacity.slo.ttft_ms=200",
        ),
        Example(
            f"{M}.tune tune.verify=false 'tune.space.replicas=[1,2,4,8]'",
            "how many GPUs for 150 req/s",
            more="tune.target_qps=150",
        ),
    ),
    outputs=(
        "tmp/tune/<run_id>/: tune.csv, tune.json, tune.png (Pareto), report.md with the",
        "  recommended vllm serve command",
    ),
    knobs=(
        knob("tune.space.max_num_seqs", "[4,8,16,32]", "vllm serve's knobs: lists or lo:hi:xF"),
        knob("tune.space.max_num_batched_tokens", "[64,128,256,512]", "tokens per step"),
        knob("tune.objective", "capacity", "or goodput, at tune.qps"),
        knob("tune.verify", "top_k", "the best 3 (tune.top_k) on real servers; grid; false"),
        knob("capacity.slo.ttft_ms", "100.0", "the goals (capacity.slo.*)"),
        knob("capacity.slo.tpot_ms", "30.0", "TPOT goal (0: none)"),
        derived(
            "backend.max_num_seqs",
            ("tune.space.max_num_seqs",),
            "each configuration's own",
        ),
        RUN_ID,
    ),
    groups=(*TINY_CPU, ("workload", "synthetic"), ("backend", "vllm")),
    presets=("tune_qwen3_0_6b_h100", "tune_qwen3_4b_h100", "tune_qwen3_8b_h100"),
)

BENCH_IMPORT = StageHelp(
    purpose=(
        "turns a `vllm bench serve` result or a GuideLLM benchmarks.json into our own",
        "workload and real_bench runs; export_from= writes one of ours as vllm bench's JSON.",
    ),
    examples=(
        Example(
            f"{M}.bench_import source=result.json model=qwen3_0_6b",
            "a vllm bench serve result",
            more="output.run_id=mine",
        ),
        Example(
            f"{M}.bench_import source=benchmarks.json output.run_id=mine", "GuideLLM: mine-0, ..."
        ),
        Example(f"{M}.bench_import source=benchmarks.json 'benchmarks=[2]'", "one benchmark"),
        Example(
            f"{M}.bench_import export_from=tmp/vidur_simulate/mine",
            "ours, as vllm bench's JSON",
            more="output.run_id=out",
        ),
    ),
    outputs=(
        "tmp/workload/<id>/ and tmp/real_bench/<id>/ per imported run (<run_id>-<k> for several)",
        "tmp/bench_import/<run_id>/: import.json; export: vllm_bench_serve.json",
    ),
    knobs=(
        knob("source", "null", "the result file to import"),
        knob("format", "auto", "or vllm_bench, guidellm"),
        knob("benchmarks", "[]", "GuideLLM: which benchmarks ([]: all)"),
        knob("export_from", "null", "a real_bench or vidur_simulate run to export"),
        knob("seed", "0", "the random prompt tokens (neither tool keeps prompts)"),
        knob("model.name", "qwen3_tiny", "the model that served the run (model=...)"),
        RUN_ID,
    ),
    groups=TINY_CPU,
)

DEEP_PROFILE = StageHelp(
    purpose=(
        "where the time goes, from formulas down to kernels: FLOP/byte analysis, torch",
        "profiler tables with MFU/MBU, Nsight Systems and Compute (skipped without a GPU).",
    ),
    examples=(
        Example(f"{M}.deep_profile model=qwen3_tiny", "CPU, ~15-30 s"),
        Example(
            f"{M}.deep_profile model=qwen3_0_6b hardware=h100",
            "GPU: nsys and ncu too",
            more="workload_dir=tmp/workload/demo num_requests=8",
        ),
        Example(
            f"{M}.deep_profile pipeline.nsys.enable=false",
            "no Nsight",
            more="pipeline.ncu.enable=false",
        ),
    ),
    outputs=(
        "tmp/deep_profile/<run_id>/: report.md, stakeholder_summary.md, steps.json, env.json;",
        "  one folder per step: static_analysis/, torch_profiler/, nsys/, ncu/",
    ),
    knobs=(
        knob("workload_dir", "null", "null: a small synthetic workload (workload.*)"),
        knob("num_requests", "4", "requests profiled"),
        knob("pipeline.static_analysis.enable", "true", "FLOPs, bytes, roofline"),
        knob("pipeline.torch_profiler.enable", "true", "operator tables, MFU/MBU"),
        knob("pipeline.nsys.enable", "true", "Nsight Systems (a GPU and nsys)"),
        knob("pipeline.ncu.enable", "true", "Nsight Compute (a GPU and ncu)"),
        RUN_ID,
    ),
    groups=TINY_CPU,
)

STAGE_HELP: Mapping[str, StageHelp] = MappingProxyType(
    {
        "workload": WORKLOAD,
        "vidur_profile": VIDUR_PROFILE,
        "vidur_simulate": VIDUR_SIMULATE,
        "real_bench": REAL_BENCH,
        "compare": COMPARE,
        "pipeline": PIPELINE,
        "fidelity": FIDELITY,
        "capacity": CAPACITY,
        "tune": TUNE,
        "bench_import": BENCH_IMPORT,
        "deep_profile": DEEP_PROFILE,
    }
)
"""Stage (its primary config's name) -> its ``--help`` page."""
