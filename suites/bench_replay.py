"""Replay memories: add (one item and a batch), sample and update_priorities rates, each memory filled
to CAPACITY first. Measured with `rlbench bench replay`'s own code (rlbench.bench.replay): operations of
every memory interleaved in rounds, median round reported, one thread."""

from __future__ import annotations

import functools
from typing import Any

from .common import lookup, registry, unavailable

from rlbench.bench.matrix import REPLAYS

CAPACITY = 100_000
BATCH = 256
SECONDS = 0.5  # per operation and memory, split over rlbench.bench.replay.ROUNDS rounds


class Replay:
    params = [list(REPLAYS)]
    param_names = ["replay"]
    timeout = 600

    def setup_cache(self) -> dict[str, Any]:
        from rlbench.bench.replay import run_benchmark
        from rlbench.kit.bench import pin_one_thread

        pin_one_thread()
        skipped = unavailable("replay")
        subjects = {name: ("registered", functools.partial(registry().get("replay", name).create,
                                                           capacity=CAPACITY, alpha=0.6, seed=0))
                    for name in REPLAYS if name not in skipped}
        results = run_benchmark(subjects, capacity=CAPACITY, batch_size=BATCH, seconds=SECONDS, unavailable=skipped)
        return {name: {"skipped": skipped[name]} if name in skipped else {"metrics": results[name]["per_second"]}
                for name in REPLAYS}

    def setup(self, cache: dict[str, Any], replay: str) -> None:
        self.rates = lookup(cache, replay)

    def track_add_one(self, cache, replay) -> float:
        return self.rates["add_1"]

    track_add_one.unit = "add(1) calls/s"

    def track_add_batch(self, cache, replay) -> float:
        return self.rates["add_batch"]

    track_add_batch.unit = f"add({BATCH}) calls/s"

    def track_sample(self, cache, replay) -> float:
        return self.rates["sample"]

    track_sample.unit = f"sample({BATCH}) calls/s"

    def track_update_priorities(self, cache, replay) -> float:
        return self.rates["update"]

    track_update_priorities.unit = f"update_priorities({BATCH}) calls/s"
