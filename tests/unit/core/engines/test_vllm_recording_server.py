"""The recording server's command line, read by vLLM's own parser: the recorder is vLLM's
synchronous ``Scheduler``, so a recording server turns async scheduling off."""

from __future__ import annotations

import itertools
from pathlib import Path

from gpu_simulate_test.core.engines.vllm import VllmBackend
from tests.conftest import vllm_stage_config


def test_the_recording_server_runs_vllms_synchronous_scheduler(
    compose_stage, tmp_path: Path
) -> None:
    """The recorder subclasses vLLM's synchronous ``Scheduler``; on a GPU vLLM turns async
    scheduling on by default (two batches in flight, ``step_with_batch_queue``), which only its
    ``AsyncScheduler`` serves. So a recording server asks for ``--no-async-scheduling``, which
    vLLM's own parser reads as ``async_scheduling=False``; a server that records nothing keeps
    vLLM's default."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from gpu_simulate_test.core.engines import step_record
    from gpu_simulate_test.core.engines.vllm_recording_scheduler import RecordingScheduler

    assert issubclass(RecordingScheduler, Scheduler)
    assert not issubclass(RecordingScheduler, AsyncScheduler)
    parser = make_arg_parser(FlexibleArgumentParser())  # the api_server's own (its main())
    for hardware in ("cpu", "h100"):
        backend = VllmBackend(vllm_stage_config(compose_stage, f"hardware={hardware}"))
        plain = backend.server_command(8000, tmp_path)
        assert "--scheduler-cls" not in plain and "--no-async-scheduling" not in plain
        backend.steps_path = tmp_path / step_record.STEPS_FILE
        cmd = backend.server_command(8000, tmp_path)
        assert dict(itertools.pairwise(cmd))["--scheduler-cls"] == step_record.SCHEDULER_CLS
        args = AsyncEngineArgs.from_cli_args(parser.parse_args(cmd[3:]))
        assert args.async_scheduling is False and args.scheduler_cls == step_record.SCHEDULER_CLS
        plain_args = parser.parse_args(plain[3:])  # after python -m api_server
        assert AsyncEngineArgs.from_cli_args(plain_args).async_scheduling is None
