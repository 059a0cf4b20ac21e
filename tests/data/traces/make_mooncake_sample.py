"""Write ``mooncake_sample.jsonl``: a small synthetic trace in Mooncake's published format.

Synthetic, not production data: 60 requests built to have the shapes Mooncake's traces show
(prompts of a few thousand tokens in 512-token blocks, a few system prompts many requests start
with, multi-turn conversations whose turn k repeats turn k-1's full blocks, one-off requests),
arriving as a Poisson process at about 2 requests/s from 1.5 s in (the reader rebases them).

Run from the repository root: ``python tests/data/traces/make_mooncake_sample.py``; the output
is the same every time (seeded).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

BLOCK = 512
OUT = Path(__file__).with_name("mooncake_sample.jsonl")


class Blocks:
    """Hash ids as Mooncake numbers them: each new block content gets the next integer."""

    def __init__(self) -> None:
        self.next_id = 0

    def new(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids


def request(prefix: list[int], tokens: int, blocks: Blocks, rng: random.Random) -> dict:
    """A request whose prompt is the full blocks of ``prefix`` then ``tokens`` new tokens."""
    length = len(prefix) * BLOCK + tokens
    ids = prefix + blocks.new(-(-length // BLOCK) - len(prefix))
    return {"input_length": length, "output_length": rng.randint(16, 600), "hash_ids": ids}


def main() -> None:
    rng = random.Random(62)
    blocks = Blocks()
    systems = [blocks.new(n) for n in (2, 4, 6)]  # system prompts, whole blocks
    pending: list[dict] = []
    conversations = [(rng.choice(systems), rng.randint(2, 5)) for _ in range(8)]
    for system, turns in conversations:
        full = list(system)
        for _ in range(turns):
            req = request(full, rng.randint(300, 2500), blocks, rng)
            pending.append(req)
            # the next turn repeats this prompt's full blocks (its partial last block is
            # completed by the answer and the new message: new content, a new id)
            full = req["hash_ids"][: req["input_length"] // BLOCK]
    while len(pending) < 48:  # one-off requests behind a system prompt
        pending.append(request(list(rng.choice(systems)), rng.randint(100, 4000), blocks, rng))
    while len(pending) < 60:  # requests sharing nothing
        pending.append(request([], rng.randint(200, 6000), blocks, rng))
    # shuffled, but the conversations' turns (rows 0 .. n_turns - 1) keep their order
    n_turns = sum(turns for _, turns in conversations)
    order = list(range(len(pending)))
    rng.shuffle(order)
    in_order = iter(range(n_turns))
    order = [next(in_order) if i < n_turns else i for i in order]
    now = 1500.0
    renumbered: dict[int, int] = {}  # ids in order of first use, as the trace is read
    with OUT.open("w", encoding="utf-8") as handle:
        for i in order:
            req = pending[i]
            ids = [renumbered.setdefault(h, len(renumbered)) for h in req["hash_ids"]]
            handle.write(json.dumps({"timestamp": int(now), **req, "hash_ids": ids}) + "\n")
            now += rng.expovariate(2.0) * 1000.0


if __name__ == "__main__":
    main()
