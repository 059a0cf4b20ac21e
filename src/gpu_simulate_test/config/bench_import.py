"""Typed config of the ``bench_import`` stage: another tool's result file in as our runs, or one
of our runs out in ``vllm bench serve``'s format."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from gpu_simulate_test.config.schema import (
    ConfigError,
    HardwareConfig,
    ModelConfig,
    OutputConfig,
    _check,
    _check_choice,
)

IMPORT_FORMATS: tuple[str, ...] = ("auto", "vllm_bench", "guidellm")
EXPORT_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class BenchImportStageConfig:
    """``bench_import``: with ``source``, a ``vllm bench serve`` result or a GuideLLM
    ``benchmarks.json`` becomes a workload run and a real_bench run per benchmark in it; with
    ``export_from``, a real_bench or vidur_simulate run is written as a ``vllm bench serve``
    result."""

    source: str | None = None
    """The result file to import (``vllm bench serve --save-result --save-detailed`` JSON, or
    GuideLLM's ``benchmarks.json``)."""
    format: str = "auto"
    """auto (told apart by their keys), vllm_bench or guidellm."""
    benchmarks: tuple[int, ...] = ()
    """Which runs of the file to import, 0-based (a GuideLLM sweep's benchmarks, the results
    of ``--append-result``); empty imports every one."""
    seed: int = 0
    """Seed of the imported workload's random prompt token ids (the files keep no prompts)."""
    export_from: str | None = None
    """A complete real_bench or vidur_simulate run to write as a ``vllm bench serve`` result."""
    export_metrics: tuple[str, ...] = ("ttft", "tpot", "itl")
    """``--percentile-metrics`` of the export (vLLM's default: ttft, tpot, itl)."""
    export_percentiles: tuple[int, ...] = (99,)
    """``--metric-percentiles`` of the export (vLLM's default: 99), from our one list."""
    model: ModelConfig = MISSING
    """The model the imported run served: its context bounds the lengths; compare checks it."""
    hardware: HardwareConfig = MISSING
    """Where the imported run ran (recorded; compare flags a simulation on other hardware)."""
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True
    """Print the imported runs' headline figures."""

    def __post_init__(self) -> None:
        if bool(self.source) == bool(self.export_from):
            raise ConfigError(
                "pass exactly one of source=<result file> (import) or export_from=<run dir> "
                "(export)"
            )
        _check_choice("format", self.format, IMPORT_FORMATS)
        _check(all(b >= 0 for b in self.benchmarks), "benchmarks must be indexes >= 0")
        _check(
            len(set(self.benchmarks)) == len(self.benchmarks),
            f"benchmarks={list(self.benchmarks)} names a run more than once; name each run of "
            "the file once (it would be imported twice, as two runs)",
        )
        _check(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        for metric in self.export_metrics:
            _check_choice("export_metrics", metric, EXPORT_METRICS)
