"""An engine calibrated as a fleet runs it: ``backend.servers=N`` in an engine calibration with
``engine.beside_neighbours=true`` (the pipeline's ``calibrate_beside_neighbours``; off by
default: it stands for a fleet whose engines are all busy, not for one whose neighbours idle).

A fleet's engines share the machine: on CPU each has its own cores, but the client, the API
servers and the engines' memory traffic are shared, and on this project's 2-core host two
engines behind round robin took 39% longer per step than one engine timed alone. So a fleet's
calibration starts the fleet's N servers, as the real bench would, and sends every request of
the calibration to all of them at once: server 0 is the one timed (its requests, steps and step
record are the calibration's, exactly as one server's would be); the other servers run a copy of
each request at the same moment, so that server 0's steps are timed beside neighbours doing the
same work. Each engine of a fleet under an even load is in that position; the simulated fleet
runs N copies of the engine so timed.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.core.engines.vllm_fleet import VllmFleetBackend

TIMED = 0
"""The server whose steps the calibration times."""


class VllmNeighboursBackend(VllmFleetBackend):
    """N servers, every request sent to each; server :data:`TIMED` recorded, the others loaded."""

    neighbours: ClassVar[bool] = True

    def attach(self, k: int, starter: VllmBackend, recorder: Recorder) -> VllmBackend:
        if k == TIMED:
            member = super().attach(k, starter, recorder)
            member.serves = None  # every request is its own
            return member
        own = Recorder([])
        member = VllmBackend(self.attached_config(k, starter))
        member.log_dir = starter.log_dir
        member.start(own)
        return member

    def submit(self, request: BenchRequest) -> None:
        for member in self.members[1:]:
            assert member.recorder is not None
            member.recorder.add([request])
        self.members[TIMED].submit(request)
        for member in self.members[1:]:
            member.submit(request)

    def cancel(self, request_id: int) -> None:
        for member in self.members:
            member.cancel(request_id)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(router=None, router_seed=None, timed_server=TIMED, neighbours=self.count - 1)
        return info

    def __getattr__(self, name: str) -> Any:
        """The timed server's client's attributes (its step log, step record and their offsets,
        its KV cache's size) are the calibration's; before it starts, its starter's."""
        if name.startswith("_") or "members" not in self.__dict__:
            raise AttributeError(name)
        timed = self.members[TIMED] if self.members else self.starters[TIMED]
        return getattr(timed, name)
