"""The real bench's verdict on its own run: was it disturbed (late sends, held-back streams,
foreign CPU)? The signs and their limits are :mod:`gpu_simulate_test.core.host.disturbance`'s; this
module gathers what one run measured for them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from gpu_simulate_test.core.engines import Backend
from gpu_simulate_test.core.engines.records import RequestRecord
from gpu_simulate_test.core.host.busy import ForeignLoad, OwnLoad, listening_pids
from gpu_simulate_test.core.host.disturbance import Verdict, judge
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.io.schemas import ENGINE_STEP_LOG
from gpu_simulate_test.real_bench.metrics import pooled_itls_s


def foreign_load(backend: Backend) -> ForeignLoad:
    """A :class:`ForeignLoad` for the replay: a server the user runs on this machine (found by
    its port) is the engine, not a foreign process."""
    port = urlparse(str(getattr(backend, "base_url", "") or "")).port
    return ForeignLoad(exclude=frozenset(listening_pids(port)) if port else frozenset())


class ReplayCpu:
    """Who used the CPU during the replay: other processes (:class:`ForeignLoad`, in cores)
    and this process and each it started (:class:`OwnLoad`: the client, vLLM's API server, its
    engine). Stopped right after the replay, while a server the backend started still runs;
    :meth:`stop` is idempotent."""

    def __init__(self, backend: Backend) -> None:
        self.foreign = foreign_load(backend)
        self.own = OwnLoad()
        self.foreign_cores: float | None = None
        self.own_cores: dict[str, float] = {}
        self._stopped = False

    def start(self) -> ReplayCpu:
        self.foreign.start()
        self.own.start()
        return self

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.foreign_cores = self.foreign.stop()
            self.own_cores = self.own.stop()


def decode_step_ms(run_dir: Path) -> list[float]:
    """``elapsed_ms`` of the steps that generated tokens in the run's engine step log (empty
    without one)."""
    path = run_dir / layout.ENGINE_STEP_LOG
    if not path.is_file():
        return []
    steps = read_csv(path, ENGINE_STEP_LOG)
    return steps.loc[steps["num_decode_tokens"] > 0, "elapsed_ms"].astype(float).tolist()


def run_verdict(
    run_dir: Path, records: Sequence[RequestRecord], foreign_cores: float | None, why_not: str
) -> Verdict:
    """Every disturbance sign of the run in ``run_dir`` (its step log already written).

    Late sends compare each send with its scheduled time; a multi-turn session's later turn's is
    the time its closed loop intended (the previous turn's last token + think time), so a turn
    sent late against it is a late send. Only a turn that could not be sent on time (its think
    time ended before its previous turn's stream closed: ``RequestRecord.sent_when_due``) is left
    out: its delay is the stream's, not the client's."""
    sent = [
        (r.arrival_s - r.scheduled_arrival_s, r.scheduled_arrival_s)
        for r in records
        if r.arrival_s is not None and r.sent_when_due
    ]
    errors, scheduled = [e for e, _ in sent], [s for _, s in sent]
    steps = decode_step_ms(run_dir)
    return judge(errors, pooled_itls_s(records), steps, foreign_cores, why_not, scheduled)
