"""The ``fidelity`` stage: how far the simulator is from the real engine, at several loads.

One run, ``<output.root>/fidelity/<run_id>/`` (file names in :mod:`.contract`):

1. **Capacity** (the real phase, :mod:`.real_phase`): an all-at-once burst of
   ``fidelity.probe_requests`` requests is replayed for real; capacity = completed requests /
   (last completion − first arrival). ``fidelity.capacity_qps`` skips the probe.
2. **Loads** (the real phase): per fraction in ``fidelity.loads``, the workload at that rate
   (same seed, same lengths at every load), a Vidur profile when the bundle does not cover it,
   and the real bench (``fidelity.real_repeats`` times). A vLLM backend gets one server for all
   of it. The manifest is rewritten after every load, so a stopped real phase keeps its loads.
3. **Simulation and report** (the sim phase, :mod:`.sim_phase`): per load, Vidur on the recorded
   workload and arrivals with the same derived scheduler knobs, compare against the recorded
   real run, then the error table, the latency-vs-load plot and ``report.md``.

``fidelity.phase=all`` does all three here; ``real`` stops after 2 (it never imports Vidur: the
GPU machine's half); ``sim`` does 3 from a real phase's run directory (``fidelity.real_from``),
or from a bench_import run (another tool's benchmark, each imported run a load: :mod:`.imported`).
Every stage run of the campaign lands inside the run directory (``runs/<stage>/...``), so the
directory is the whole record and can be tarred and moved. The steps themselves (plan and
profile, serve, the truth, simulate-and-compare) are :mod:`gpu_simulate_test.orchestrate`'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.core.model.device import torch_threads
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.fidelity import contract
from gpu_simulate_test.fidelity.imported import import_source, is_import
from gpu_simulate_test.fidelity.real_phase import real_phase
from gpu_simulate_test.fidelity.sim_phase import sim_phase, sim_source
from gpu_simulate_test.io.runs import default_run_id, start_run
from gpu_simulate_test.orchestrate.steps import check_trace


def run(cfg: FidelityStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """The campaign (or, with ``fidelity.summarize``, one table over earlier ones); returns the
    run directory."""
    opts = cfg.fidelity
    if opts.summarize:
        from gpu_simulate_test.fidelity.combined import summarize

        return summarize(cfg, resolved_config)
    source: dict[str, Any] | None = None
    if opts.phase == "sim":  # every input check before the run directory exists
        assert opts.real_from
        src = Path(opts.real_from)
        source = import_source(cfg, src) if is_import(src) else sim_source(src)
    else:  # a bad trace refused before the run exists
        check_trace(cfg.workload, cfg.model)
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    with (
        torch_threads(opts.torch_threads),
        start_run(
            cfg.output.root,
            "fidelity",
            run_id,
            resolved_config,
            cfg.output.overwrite,
            [opts.real_from] if opts.real_from else [],
        ) as r,
    ):
        started = time.perf_counter()
        r.update_meta(phase=opts.phase)
        if source is None:
            real_phase(cfg, r, started)
            if opts.phase == "real":
                if cfg.progress:
                    console.print(
                        f"[bold]manifest:[/] {r.file(contract.MANIFEST_FILE)}; simulate with "
                        f"fidelity.phase=sim fidelity.real_from={r.path}"
                    )
                return r.path
            source = sim_source(r.path)
        sim_phase(cfg, r, source, started)
    return r.path
