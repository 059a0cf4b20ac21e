"""Where a real request's first token spends its time, hop by hop, at the client.

Two sources of stamps split each request's client TTFT (send → first token received) into hops
that add up to it (:class:`Source`). A vLLM server's run (:data:`API_SERVER`) has five:

1. **client → API server**: the send to the API server taking the request in (HTTP, the
   server's event loop), from its span (``front_end_stamps.csv``, :mod:`..core.engines.front_end`);
2. **API server → engine**: to the engine queueing it (tokenization, input processing, the hop to
   the engine core, which takes input in only between steps: the step running when it came);
3. **engine**: queued to its first token (the engine's clock: what Vidur models);
4. **engine → API server**: the first output back to the API server (detokenizing, the output
   queue behind other requests' outputs);
5. **API server → client**: streamed to the client and read there.

An in-process engine (:data:`IN_PROCESS`: ``hf_cb``, ``vllm_engine``: no API server between the
client and the engine, :attr:`~..core.engines.base.Backend.api_server`) has no such file; its
request table's own stamps split the same time three ways: the client's send to the engine
queueing it (``arrival_time_s`` → ``engine_arrival_time_s``), the engine (→
``engine_first_token_time_s``) and the first token's way to the client's thread (→
``first_token_time_s``).

The engine's stamps are on its own clock, the API server's on the wall clock and the client's
on this process's: a hop below zero says how far they disagree (counted, never hidden).

The simulation splits its first tokens three ways (its request table's ``frontend_input_s``,
``held_back_s``, ``frontend_first_token_s``), which the real hops add up to (each source's
``sides``, named :data:`PARTS`): the send to the engine queueing the request (the input's way in
and the wait for the step that was running), the engine's own part, and the first token's way
back. Beside each other they say which part of the client's TTFT the simulation gets wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import send_state
from gpu_simulate_test.core.engines import get_backend
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.io.schemas import FRONT_END_STAMPS

Hop = tuple[str, str, str]
"""A hop: its name, and the stamps it runs from and to (run clock, seconds)."""
Side = tuple[str, tuple[str, ...]]
"""A part the simulation splits its first tokens into, and the real hops that add up to it."""

ENGINE_HOP = "engine (queue + first token)"
"""The engine's own part, the same in every source: what Vidur models."""
HOPS: tuple[Hop, ...] = (
    ("client → API server", "arrival_time_s", "front_arrival_time_s"),
    ("API server → engine", "front_arrival_time_s", "engine_arrival_time_s"),
    (ENGINE_HOP, "engine_arrival_time_s", "engine_first_token_time_s"),
    ("engine → API server", "engine_first_token_time_s", "front_first_token_time_s"),
    ("API server → client", "front_first_token_time_s", "first_token_time_s"),
)
"""The API server's hops (:data:`API_SERVER`)."""
IN_PROCESS_HOPS: tuple[Hop, ...] = (
    ("client → engine queued", "arrival_time_s", "engine_arrival_time_s"),
    (ENGINE_HOP, "engine_arrival_time_s", "engine_first_token_time_s"),
    ("engine → client", "engine_first_token_time_s", "first_token_time_s"),
)
"""An in-process engine's hops, from the request table alone (:data:`IN_PROCESS`)."""
STATS: tuple[str, ...] = ("p50", "p90", "p99", "mean")
PARTS: tuple[str, ...] = ("send → engine queued", ENGINE_HOP, "first token → client")
"""The parts the simulation splits its first tokens into, in every source's ``sides``."""
SIDES: tuple[Side, ...] = (
    (PARTS[0], ("client → API server", "API server → engine")),
    (PARTS[1], (ENGINE_HOP,)),
    (PARTS[2], ("engine → API server", "API server → client")),
)
"""Each part with the API server's hops it adds up."""
IN_PROCESS_SIDES: tuple[Side, ...] = (
    (PARTS[0], ("client → engine queued",)),
    (PARTS[1], (ENGINE_HOP,)),
    (PARTS[2], ("engine → client",)),
)
"""Each part with the in-process engine's hop it is."""


@dataclass(frozen=True)
class Source:
    """Whose stamps split a run's first tokens, into which hops."""

    name: str
    """``comparison.json`` ``ttft_parts.source``."""
    hops: tuple[Hop, ...]
    sides: tuple[Side, ...]
    """Each of :data:`PARTS` with the hops it adds up."""
    stamps: str
    """Whose stamps, in words (``summary.md``)."""
    label: str
    """The kind in a few words (the section's and the plot's)."""
    held_back: str
    """Where the real hops put the wait for the step running at the send (``summary.md``)."""


API_SERVER = Source(
    "api_server",
    HOPS,
    SIDES,
    "the client's, the API server's (its span, `front_end_stamps.csv`) and the engine's stamps",
    "API server hops",
    "the wait for the step running at the send is in the way in on both sides (the engine core "
    "takes input in only between steps; the simulation's `held_back_s`)",
)
IN_PROCESS = Source(
    "in_process",
    IN_PROCESS_HOPS,
    IN_PROCESS_SIDES,
    "the request table's own stamps (the client's send and receipt, the engine's queueing and "
    "first token: the engine runs in the client's process, no API server between them)",
    "an in-process engine's own stamps",
    "the simulation puts the wait for the step running at the send in the way in "
    "(`held_back_s`), an engine that stamps a request as it is handed over (hf_cb's "
    "`created_time`) in its own part",
)
SOURCES: Mapping[str, Source] = MappingProxyType({s.name: s for s in (API_SERVER, IN_PROCESS)})
"""Every source by its name."""
SIM_COLUMNS: tuple[str, ...] = ("frontend_input_s", "held_back_s", "frontend_first_token_s")
"""The simulated request table's split of its front end (:mod:`..vidur_simulate.metrics`)."""


def sim_parts(sim: pd.DataFrame) -> pd.DataFrame:
    """Per simulated ok request with the split: each of :data:`PARTS` in ms (the engine's part
    is the TTFT less the others); empty without the split (an older run, no front end)."""
    if not set(SIM_COLUMNS) <= set(sim.columns):
        return pd.DataFrame()
    ok = sim[sim["status"] == "ok"]
    cols = ok[[*SIM_COLUMNS, "ttft_s"]].apply(pd.to_numeric, errors="coerce")
    whole = cols.notna().all(axis=1)
    cols = cols[whole]
    into = cols["frontend_input_s"] + cols["held_back_s"]
    back = cols["frontend_first_token_s"]
    return pd.DataFrame(
        {
            "request_id": ok.loc[whole, "request_id"].to_numpy(),
            PARTS[0]: 1e3 * into.to_numpy(),
            PARTS[1]: 1e3 * (cols["ttft_s"] - into - back).to_numpy(),
            PARTS[2]: 1e3 * back.to_numpy(),
        }
    )


def side_by_side(
    hops: pd.DataFrame, sim: pd.DataFrame | None, sides: Sequence[Side] = SIDES
) -> list[dict[str, Any]]:
    """Each of ``sides``, real (its hops added) against simulated, over the requests both
    have: p50, p90 and mean in ms each; empty without the simulated split."""
    parts = pd.DataFrame() if sim is None else sim_parts(sim)
    if parts.empty:
        return []
    both = hops.merge(parts, on="request_id", how="inner", suffixes=("", " (sim)"))
    if both.empty:
        return []
    out = []
    for name, real_hops in sides:
        real = both[list(real_hops)].sum(axis=1).to_numpy(dtype=float)
        simulated = both[f"{name} (sim)" if name in hops.columns else name].to_numpy(dtype=float)
        out.append(
            {
                "part": name,
                "requests": len(both),
                **{
                    f"{side}_{s}": float(np.percentile(v, int(s[1:])) if s != "mean" else v.mean())
                    for side, v in (("real", real), ("sim", simulated))
                    for s in ("p50", "p90", "mean")
                },
            }
        )
    return out


def by_send_state(
    hops: pd.DataFrame,
    requests: pd.DataFrame,
    sim: pd.DataFrame | None,
    sides: Sequence[Side] = SIDES,
) -> list[dict[str, Any]]:
    """Each of ``sides`` real against simulated per engine state at the send
    (:mod:`.send_state`); empty without the simulated split or the real engine's stamps."""
    parts = pd.DataFrame() if sim is None else sim_parts(sim)
    real_state = send_state.real_states(requests)
    sim_state = None if sim is None else send_state.sim_states(sim)
    if parts.empty or real_state is None or sim_state is None:
        return []
    real = pd.DataFrame(
        {"request_id": hops["request_id"].to_numpy()}
        | {name: hops[list(real_hops)].sum(axis=1).to_numpy() for name, real_hops in sides}
    )
    return send_state.by_state(real, real_state, parts, sim_state, list(PARTS))


def hop_frame(stamped: pd.DataFrame, hops: Sequence[Hop] = HOPS) -> pd.DataFrame:
    """Per ok request with every stamp ``hops`` read: each hop in ms, and the client TTFT
    (``total``); empty where a stamp's column is missing."""
    ok = stamped[stamped["status"] == "ok"]
    columns = {stamp for _, a, b in hops for stamp in (a, b)}
    if not columns <= set(ok.columns):
        return pd.DataFrame()
    stamps = ok[sorted(columns)].apply(pd.to_numeric, errors="coerce")
    whole = stamps.notna().all(axis=1)
    out = pd.DataFrame({"request_id": ok.loc[whole, "request_id"].to_numpy()})
    for name, start, end in hops:
        out[name] = 1e3 * (stamps.loc[whole, end] - stamps.loc[whole, start]).to_numpy()
    out["total"] = out[[name for name, _, _ in hops]].sum(axis=1)
    return out


def read_front(run_dir: Path) -> pd.DataFrame | None:
    """A real run's ``front_end_stamps.csv``; None where it has none (another engine, an older
    run, a server without spans)."""
    path = run_dir / layout.FRONT_END_STAMPS
    return read_csv(path, FRONT_END_STAMPS) if path.is_file() else None


def behind_api_server(meta: Mapping[str, Any]) -> bool:
    """Whether a real run (its ``run_meta.json``) reached its engine through an API server
    (:attr:`~..core.engines.base.Backend.api_server`); a backend not known here counts as
    one, so a server's stamps are never read as an in-process engine's."""
    backend = (meta.get("config") or {}).get("backend") or {}
    try:
        return get_backend(str(backend.get("name"))).api_server
    except ValueError:
        return True


def stamped_requests(
    run_dir: Path, requests: pd.DataFrame, api_server: bool
) -> tuple[Source, pd.DataFrame] | None:
    """The source of a real run's first-token stamps and its requests with them: the API
    server's where the run has ``front_end_stamps.csv``, else, without an API server
    (``api_server`` false), the request table's own; None with neither."""
    front = read_front(run_dir)
    if front is not None:
        return API_SERVER, requests.merge(front, on="request_id", how="inner")
    return None if api_server else (IN_PROCESS, requests)


def ttft_parts(
    run_dir: Path,
    requests: pd.DataFrame,
    clocks: Sequence[Mapping[str, Any]] | None = None,
    sim: pd.DataFrame | None = None,
    *,
    api_server: bool = True,
) -> dict[str, Any] | None:
    """``comparison.json`` ``ttft_parts``: which stamps split the first tokens (``source``, a
    name of :data:`SOURCES`, :func:`stamped_requests`; ``api_server``: whether the run had an
    API server, :func:`behind_api_server`), each hop's stamps, p50/p90/p99/mean (ms) and share
    of the mean client TTFT, the hops below zero, the simulation's front end beside the real
    one (``clocks``' TTFT rows), and with ``sim`` (its request table) each part the simulation
    splits its first tokens into beside the real hops it adds up (``simulated``,
    :func:`side_by_side`); None without stamps that split them."""
    found = stamped_requests(run_dir, requests, api_server)
    if found is None:
        return None
    source, stamped = found
    hops = hop_frame(stamped, source.hops)
    if hops.empty:
        return None
    mean_total = float(hops["total"].mean())
    parts = []
    for name, start, end in source.hops:
        values = hops[name].to_numpy(dtype=float)
        parts.append(
            {
                "hop": name,
                "from": start,
                "to": end,
                **{s: float(np.percentile(values, int(s[1:]))) for s in STATS if s != "mean"},
                "mean": float(values.mean()),
                "share_of_mean": float(values.mean() / mean_total) if mean_total else None,
                "below_zero": int((values < 0).sum()),
            }
        )
    front_end = {
        row["stat"]: {
            "real_ms": 1e3 * float(row["front_end_s"]),
            "sim_ms": 1e3 * float(row["sim_front_end_s"]),
            **repeat_front_end(row),
        }
        for row in clocks or ()
        if row["metric"] == "ttft"
    }
    return {
        "source": source.name,
        "requests": len(hops),
        "hops": parts,
        "client_ttft_ms": {s: float(np.percentile(hops["total"], int(s[1:]))) for s in STATS[:3]},
        "front_end": front_end,
        "simulated": side_by_side(hops, sim, source.sides),
        "by_send_state": by_send_state(hops, requests, sim, source.sides),
        "per_request": hops,
    }


def repeat_front_end(row: Mapping[str, Any]) -> dict[str, float]:
    """The truth's repeat's front end (its client less its engine TTFT at the row's stat), in
    ms, beside the run's: ``{"repeat_ms": ...}``; empty without a repeat."""
    client, engine = row.get("repeat_client_s"), row.get("repeat_engine_s")
    if client is None or engine is None or not np.isfinite(client - engine):
        return {}
    return {"repeat_ms": 1e3 * float(client - engine)}
