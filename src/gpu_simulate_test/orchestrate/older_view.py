"""A current bundle seen as an older calibration: what do the terms it lacks move (issue 63)?

A bundle calibrated by an older version (``CALIBRATION_VERSION``) is simulated with what it
measured (``orchestrate.profiling.older_calibration``). A current bundle holds all an older one
held and the later terms beside it: with what versions N+1 on added taken out (rows, columns,
keys; what they measured otherwise and cannot be taken out is named ``kept``) and its version set
to N, it falls back as a real version-N bundle would, on the same measurements. The view is a
profiling root of its own, ``OUT/<hardware>/<model>/``, the other files copied as they are.

Run (``benchmarks/fidelity/older_view.py`` is this command; ``as_is`` simulates the current
bundle, in ``tmp/profiles`` as the stored runs' own)::

    python -m benchmarks.fidelity.older_view tmp/profiles/cpu/qwen3_tiny tmp/profiles_v9 --version 9
    python -m benchmarks.fidelity.bench_sim_variants RUN [RUN ...] \\
        --variant v11=profiling_root=tmp/profiles_v11 --variant v9=profiling_root=tmp/profiles_v9
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpu_simulate_test.calibration import busy_hop, record
from gpu_simulate_test.calibration.intake_phase import CLIENT_SEND_OFFSETS
from gpu_simulate_test.calibration.record import CALIBRATION_VERSION, CalibrationRecord, where
from gpu_simulate_test.calibration.serving_load import CLIENT_SENDS
from gpu_simulate_test.config.backends import backend_config
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.presets import hardware_preset, model_preset
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.profiling.bundle import load_bundle
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json, write_json
from gpu_simulate_test.orchestrate.profiling import older_calibration

OLDEST = 7
"""The oldest view: version 7 began the replays under load, the earliest term kept apart."""


@dataclasses.dataclass
class Table:
    """A CSV as its text cells (as the bundle's reader takes them), the rest written as it was."""

    path: Path
    header: list[str]
    rows: list[list[str]]

    @classmethod
    def read(cls, path: Path) -> Table:
        with path.open(newline="") as handle:
            header, *rows = csv.reader(handle)
        return cls(path, header, rows)

    def write(self) -> None:
        with self.path.open("w", newline="") as handle:
            csv.writer(handle, lineterminator="\n").writerows([self.header, *self.rows])

    def cell(self, row: list[str], name: str) -> str:
        """``row``'s cell of column ``name`` ("" without the column)."""
        return row[self.header.index(name)] if name in self.header else ""

    def clear(self, name: str, backend: str) -> int:
        """Empty ``backend``'s cells of column ``name`` (empty: not recorded) and take the
        column out when none is left; returns the cells emptied."""
        if name not in self.header:
            return 0
        at, emptied = self.header.index(name), 0
        for row in self.rows:
            if self.cell(row, "backend") == backend and row[at]:
                row[at], emptied = "", emptied + 1
        if not any(row[at] for row in self.rows):
            self.header.pop(at)
            for row in self.rows:
                row.pop(at)
        return emptied


@dataclasses.dataclass
class View:
    """What a view edits: the backend's ``meta.json`` entry and the two step tables."""

    backend: str
    info: dict[str, Any]
    steps: Table
    serving: Table | None

    @property
    def frontend(self) -> dict[str, Any]:
        """The front end's entry ({} without one: an engine in process)."""
        return front if isinstance(front := self.info.get("frontend"), dict) else {}

    def take(self, taken: Callable[[list[str]], bool]) -> list[list[str]]:
        """Take the backend's ``engine_steps.csv`` rows that ``taken`` picks out; returns them."""
        cell, rows = self.steps.cell, self.steps.rows
        out = [r for r in rows if cell(r, "backend") == self.backend and taken(r)]
        self.steps.rows = [r for r in rows if all(r is not o for o in out)]
        return out

    def unlist(self, taken: Callable[[list[Any]], bool]) -> int:
        """Take the experiments ``taken`` picks out of ``experiments``; returns how many."""
        listed = self.info.get("experiments") or []
        self.info["experiments"] = [e for e in listed if not taken(e)]
        return len(listed) - len(self.info["experiments"])


def _put_back(front: dict[str, Any], kept: str) -> str:
    """Put the input line kept beside under ``kept`` back in ``front``; says which it is."""
    front.update(front.pop(kept, None) or {})
    slope = front.get("input_per_running_ms")
    return f"(input_ms {front.get('input_ms')}, input_per_running_ms {slope})"


QUIET_RATES = 4
"""Version 16 replays at four rates, the quietest (2%) for the wake-ups after long idles."""


def _take_queue_reading(view: View, key: str, count: str) -> bool:
    """Take ``frontend.queue.<key>`` and the count it was read from out of ``view``; whether
    it was there."""
    queue = view.frontend.get("queue")
    if not isinstance(queue, dict) or queue.pop(key, None) is None:
        return False
    queue.pop(count, None)
    return True


def _v21(view: View) -> list[str]:
    return [
        "kept: serving_steps.csv, recorded with no write between two steps (no undoing it: the "
        "pause before a step that takes a request in as vLLM's own)"
    ]


def _v20(view: View) -> list[str]:
    if not view.frontend.get(busy_hop.KEY):
        return []
    return [
        f"kept: frontend.{busy_hop.KEY}, read with a working engine's late stamps as drains "
        "(version 19 read them as arrivals; the bundle holds no stamps to read it again)"
    ]


def _v19(view: View) -> list[str]:
    if view.frontend.pop(busy_hop.KEY, None) is None:
        return []
    view.frontend.pop(busy_hop.COUNT_KEY, None)
    return [f"frontend.{busy_hop.KEY}: a busy engine's way in on the line"]


def _v18(view: View) -> list[str]:
    if not _take_queue_reading(view, "first_busy_residual_ms", "first_busy_tokens"):
        return []
    return ["frontend.queue.first_busy_residual_ms: no spread on a busy engine's way back"]


def _v17(view: View) -> list[str]:
    steps = view.serving.clear(CLIENT_SEND_OFFSETS, view.backend) if view.serving else 0
    where = f"serving_steps.csv {CLIENT_SEND_OFFSETS} ({steps} steps)"
    return [f"{where}: the intake wherever a send falls"] if steps else []


def _v16(view: View) -> list[str]:
    done = []
    if _take_queue_reading(view, "first_idle_residual_ms", "first_idle_tokens"):
        done.append("frontend.queue.first_idle_residual_ms: no spread on an idle engine's way back")
    serving = view.serving
    if serving is None:
        return done
    mine = [r for r in serving.rows if serving.cell(r, "backend") == view.backend]
    rates = sorted({float(serving.cell(r, "rate_qps")) for r in mine})
    if len(rates) == QUIET_RATES:
        quiet = [r for r in mine if float(serving.cell(r, "rate_qps")) == rates[0]]
        taken = {id(r) for r in quiet}
        serving.rows = [r for r in serving.rows if id(r) not in taken]
        done.append(
            f"serving_steps.csv: the quietest replays ({rates[0]:.3g} req/s, {len(quiet)} steps) "
            "taken out; kept: the front end's readings, fitted with them"
        )
    return done


def _v15(view: View) -> list[str]:
    front = view.frontend
    if front.pop("input_through_steps", None) is None:
        return []
    line = _put_back(front, "input_midpoint")
    return [
        f"frontend.input_through_steps: the input line through the windows' middles put back {line}"
    ]


def _v14(view: View) -> list[str]:
    front = view.frontend
    if front.pop("input_idle_ms", None) is None:
        return []
    front.pop("input_idle_requests", None)
    line = _put_back(front, "input_all_sends")
    done = [
        "frontend.input_idle_ms: the idle engine's way in on the line, the line over every send "
        f"put back {line}"
    ]
    if front.get("input_residual_ms"):
        done.append("kept: frontend.input_residual_ms, the spread around the two-piece way in")
    return done


def _v13(view: View) -> list[str]:
    if not _take_queue_reading(view, "first_ms", "first_tokens"):
        return []
    return ["frontend.queue.first_ms: no first-chunk cost on the way back"]


def _v12(view: View) -> list[str]:
    sends = view.serving.clear(CLIENT_SENDS, view.backend) if view.serving else 0
    done = [f"serving_steps.csv {CLIENT_SENDS} ({sends} steps): no intake"] if sends else []
    (view.frontend.get("experiments_input") or {}).pop("input_residual_ms", None)
    if (spread := view.frontend.pop("input_residual_ms", None)) is not None:
        done.append(f"frontend.input_residual_ms ({len(spread)} loads): no input spread")
    analysis = ((view.info.get("serving") or {}).get("residuals") or {}).get("residuals")
    if isinstance(analysis, list) and any(r.get("candidate") == CLIENT_SENDS for r in analysis):
        analysis[:] = [r for r in analysis if r.get("candidate") != CLIENT_SENDS]
        done.append(f"serving.residuals: the {CLIENT_SENDS} candidate (a report's only)")
    if view.steps.path.with_name(layout.STEP_RESIDUALS_PLOT).is_file():  # the view's own copy
        done.append(f"kept: {layout.STEP_RESIDUALS_PLOT}'s {CLIENT_SENDS} panel")
    return done


def _v11(view: View) -> list[str]:
    cell = view.steps.cell

    def decode_context(row: list[str]) -> int:  # 0: not the backend's decode row
        decode = cell(row, "phase") == "decode" and cell(row, "backend") == view.backend
        return int(cell(row, "context_tokens")) if decode else 0

    bursts = view.take(lambda r: float(cell(r, "num_prompts") or 1) > 1)
    # the decode rows' own context is their shortest (experiments.decode_contexts: beyond it)
    short = min((c for r in view.steps.rows if (c := decode_context(r))), default=0)
    longer = view.take(lambda r: decode_context(r) > short)
    view.steps.clear("num_prompts", view.backend)
    prompt = min((e[2] for e in view.info.get("experiments") or [] if e[0] == "decode"), default=0)
    listed = view.unlist(lambda e: e[0] == "burst" or (e[0] == "decode" and e[2] > prompt))
    (view.info.get("settings") or {}).pop("bursts", None)
    seen = sorted({int(cell(r, "context_tokens")) for r in longer})
    done = [
        f"engine_steps.csv: {len(bursts)} burst rows (num_prompts > 1), the column num_prompts",
        f"engine_steps.csv: {len(longer)} decode rows at context_tokens {seen}",
        f"meta.json experiments: {listed} bursts and longer decodes; settings.bursts",
    ]
    front = view.frontend
    if (quiet := front.pop("experiments_input", None)) is not None:
        was, requests = front.get("input_ms"), front.pop("input_requests", None)
        front.pop("input_source", None)
        front.update(quiet)
        for key in [k for k, v in quiet.items() if v is None]:
            front.pop(key)
        done.append(
            f"frontend's input line from {requests} replayed requests: the experiments' put "
            f"back (input_ms {was} -> {front.get('input_ms')})"
        )
    if longer:
        done.append("kept: step_jitter, its spread over the longer decodes' steps too")
    return done


def _v10(view: View) -> list[str]:
    cached = view.take(lambda r: view.steps.cell(r, "phase") == "cached_prefill")
    listed = view.unlist(lambda e: e[0] == "cached_prefill")
    return [f"engine_steps.csv: {len(cached)} cached_prefill rows ({listed} experiments)"]


def _v9(view: View) -> list[str]:
    return ["kept: the steps timed after a warm-up of every step size (no undoing it)"]


def _v8(view: View) -> list[str]:
    return ["frontend.queue: no front end as a queue"] if view.frontend.pop("queue", None) else []


STRIPS: Mapping[int, Callable[[View], list[str]]] = MappingProxyType(
    {
        21: _v21,
        20: _v20,
        19: _v19,
        18: _v18,
        17: _v17,
        16: _v16,
        15: _v15,
        14: _v14,
        13: _v13,
        12: _v12,
        11: _v11,
        10: _v10,
        9: _v9,
        8: _v8,
    }
)
"""What each version added, taken out of a view older than it."""


def older_view(bundle: Path, out: Path, version: int, backend: str | None = None) -> list[str]:
    """``bundle`` (``<root>/<hardware>/<model>``, calibrated by this code's version) as its
    calibration by ``version`` would be, written to ``out/<hardware>/<model>`` and read back as
    a simulation reads it; returns what was taken out (and kept), a line each, and last the note
    a simulation gives of the view (:func:`simulated_note`)."""
    if not OLDEST <= version < CALIBRATION_VERSION:
        raise ValueError(f"version {version}: a view is of {OLDEST} to {CALIBRATION_VERSION - 1}")
    meta = read_json(bundle / layout.BUNDLE_META)
    calibrations = meta.get("engine_calibration") or {}
    if backend is None and len(calibrations) != 1:
        raise ValueError(
            f"{bundle / layout.BUNDLE_META}: engine_calibration holds {sorted(calibrations)}: "
            "name one (backend)"
        )
    backend = backend or next(iter(calibrations))
    info = calibrations.get(backend)
    recorded = info.get("version") if isinstance(info, dict) else "missing"
    if info is None or recorded != CALIBRATION_VERSION:
        raise ValueError(
            f"{where(bundle, backend, 'version')}: {recorded!r}, expected {CALIBRATION_VERSION} "
            "(a view is taken from a calibration by this code)"
        )
    target = layout.bundle_dir(out, bundle.parent.name, bundle.name)
    if target.exists():
        raise FileExistsError(f"{target}: already there (remove it, or choose another OUT)")
    shutil.copytree(bundle, target)
    serving = target / layout.SERVING_STEPS
    steps = Table.read(target / layout.ENGINE_STEPS)
    view = View(backend, info, steps, Table.read(serving) if serving.is_file() else None)
    stripped = [
        f"{v}: {line}" for v in range(CALIBRATION_VERSION, version, -1) for line in STRIPS[v](view)
    ]
    info["version"] = version
    write_json(target / layout.BUNDLE_META, meta)
    view.steps.write()
    if view.serving is not None:
        view.serving.write()
    return [*stripped, simulated_note(out, bundle.parent.name, bundle.name, backend)]


def simulated_note(root: Path, hardware: str, model: str, backend: str) -> str:
    """The view read as a simulation reads it (:meth:`CalibrationRecord.load`) and the note
    ``older_calibration`` gives of it; ValueError when the note does not name its version."""
    path = layout.bundle_dir(root, hardware, model)
    version = CalibrationRecord.load(load_bundle(path), backend).version
    assert version is not None  # a view records its version
    try:
        model_cfg, hardware_cfg = model_preset(model), hardware_preset(hardware)
    except ConfigError:  # a model or hardware without a preset: the terms it lacks
        return f"{path}: version {version}, without " + "; ".join(record.measured_since(version))
    cfg = PipelineStageConfig(model=model_cfg, hardware=hardware_cfg, profiling_root=str(root))
    note = older_calibration(dataclasses.replace(cfg, backend=backend_config(backend)))
    if note is None or f"is version {version}," not in note:
        raise ValueError(f"{path}: a simulation does not read it as version {version}: {note}")
    return note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", type=Path, help="<profiling_root>/<hardware>/<model>")
    parser.add_argument("out", type=Path, help="the view's profiling root")
    parser.add_argument("--version", type=int, required=True)
    parser.add_argument("--backend", default=None, help="(default: the bundle's only one)")
    args = parser.parse_args()
    print("\n".join(older_view(args.bundle, args.out, args.version, args.backend)))


if __name__ == "__main__":
    main()
