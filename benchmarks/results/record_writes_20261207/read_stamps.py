"""Per busy step that takes a request in (after a pause under 5 ms), from one stored real run
(``tmp/fidelity/<campaign>/runs/real_bench/<run>``): the pause, the last taken request's queued
stamp after the last step's end, and the step's start after that stamp, each mode apart (over
0.8 ms: the long one), in ms (``stamps.txt``).

Run from the repository's root: ``python benchmarks/results/record_writes_20261207/read_stamps.py
RUN_DIR``.
"""

import sys

import numpy as np
import pandas as pd

from gpu_simulate_test.core.engines.step_record import FOREIGN, parse_requests

run = sys.argv[1]
steps = pd.read_csv(f"{run}/engine_schedule.csv")
metrics = pd.read_csv(f"{run}/request_metrics.csv")
queued = dict(zip(metrics.request_id.astype(str), metrics.engine_arrival_time_s, strict=True))
start = steps.start_time_s.to_numpy()
end = steps.end_time_s.to_numpy()
seen: set[str] = set()
rows = []
for k, items in enumerate(steps.requests):
    parsed = parse_requests(items)
    new = [rid for rid, _ in parsed if rid != FOREIGN and rid not in seen]
    seen.update(rid for rid, _ in parsed)
    pause = (start[k] - end[k - 1]) * 1e3 if k else np.inf
    if not new or pause > 5:
        continue
    last = max(queued[r] for r in new)
    rows.append(
        {
            "pause": pause,
            "queued_after_end": (last - end[k - 1]) * 1e3,
            "start_after_queued": (start[k] - last) * 1e3,
            "new_requests": len(new),
        }
    )
table = pd.DataFrame(rows)
table["mode"] = np.where(table.pause > 0.8, "long", "short")
print(f"{len(table)} steps taking a request in after a pause under 5 ms")
print(table.groupby("mode").agg(["count", "median"]).round(3).to_string())
