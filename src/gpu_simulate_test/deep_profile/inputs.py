"""The representative requests: the first N of a workload run, or a small synthetic set."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_simulate_test.config.deep_profile import DeepProfileStageConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.engines.records import BenchRequest
from gpu_simulate_test.core.traffic.requests import check_context, load_requests
from gpu_simulate_test.core.traffic.workloads import generate, load_workload

SYNTHETIC_PROMPT_SEED = 2024
WARMUP_SEED = 12345


@dataclass(frozen=True)
class ProfileInputs:
    """Requests to profile and where they came from (for ``inputs.yaml``)."""

    requests: tuple[BenchRequest, ...]
    source: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "num_requests": len(self.requests),
            "requests": [
                {
                    "request_id": r.request_id,
                    "num_prefill_tokens": r.num_prefill_tokens,
                    "num_decode_tokens": r.num_decode_tokens,
                }
                for r in self.requests
            ],
        }


def random_prompt(length: int, vocab_size: int, seed: int) -> tuple[int, ...]:
    """Random token ids (timing does not depend on which ids)."""
    rng = np.random.default_rng(seed)
    return tuple(int(t) for t in rng.integers(0, vocab_size, size=length))


def load_inputs(cfg: DeepProfileStageConfig) -> ProfileInputs:
    """The first ``cfg.num_requests`` requests of ``cfg.workload_dir``, or of ``cfg.workload``."""
    if cfg.workload_dir:
        workload = load_workload(cfg.workload_dir)
        requests = load_requests(workload, cfg.num_requests)
        source: dict[str, Any] = {
            "kind": "workload_dir",
            "workload_dir": str(cfg.workload_dir),
            "workload_id": workload.workload_id,
        }
    else:
        built, _notes = generate(cfg.workload, cfg.model)
        count = min(cfg.num_requests, built.num_requests)
        requests = [
            BenchRequest(
                request_id=i,
                num_prefill_tokens=int(built.num_prefill_tokens[i]),
                num_decode_tokens=int(built.num_decode_tokens[i]),
                scheduled_arrival_s=float(built.arrival_time_s[i]),
                prompt_token_ids=random_prompt(
                    int(built.num_prefill_tokens[i]),
                    cfg.model.vocab_size,
                    SYNTHETIC_PROMPT_SEED + i,
                ),
            )
            for i in range(count)
        ]
        source = {
            "kind": "synthetic",
            "workload_id": built.fingerprint(),
            "seed": cfg.workload.seed,
            "prompt_len": cfg.workload.prompt_len.kind,
            "output_len": cfg.workload.output_len.kind,
        }
    if len(requests) < cfg.num_requests:  # profiling fewer than asked, said nowhere
        holds = (
            f"{cfg.workload_dir} holds {len(requests)}"
            if cfg.workload_dir
            else f"the synthetic workload holds {len(requests)} (workload.num_requests)"
        )
        raise ConfigError(
            f"num_requests={cfg.num_requests}: {holds}; pass num_requests={len(requests)} or "
            f"fewer{'' if cfg.workload_dir else f', or workload.num_requests={cfg.num_requests}'}"
        )
    check_context(requests, cfg.model)
    for req in requests:
        if req.prompt_token_ids is None:
            raise ValueError(
                f"request {req.request_id} has no prompt_token_ids; build the workload with "
                "workload.prompt_mode=token_ids"
            )
    return ProfileInputs(tuple(requests), source)


def warmup_requests(
    requests: Sequence[BenchRequest], count: int, vocab_size: int
) -> list[BenchRequest]:
    """``count`` requests shaped like the first one, with fresh random prompts."""
    if not requests or count == 0:
        return []
    first = requests[0]
    return [
        BenchRequest(
            request_id=i,
            num_prefill_tokens=first.num_prefill_tokens,
            num_decode_tokens=first.num_decode_tokens,
            scheduled_arrival_s=0.0,
            prompt_token_ids=random_prompt(first.num_prefill_tokens, vocab_size, WARMUP_SEED + i),
        )
        for i in range(count)
    ]
