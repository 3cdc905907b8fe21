"""Replay memories: add (one item and a batch), sample and update_priorities rates, each memory filled
to CAPACITY first, sample and update in their cache regimes (cold, hot, and the learner's: update the
indices just sampled; see rlbench.bench.replay). Measured with `rlbench bench replay`'s own code:
operations of every memory interleaved in rounds, median round reported, one thread. `track_sample`
and `track_update_priorities` keep their names (and history): they are the cold regime."""

from __future__ import annotations

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
        from rlbench.bench.replay import builder_of, run_benchmark
        from rlbench.kit.bench import pin_one_thread
        from rlbench.machine_state import watch

        pin_one_thread()
        skipped = unavailable("replay")
        subjects = {name: ("registered", builder_of(registry().get("replay", name)))
                    for name in REPLAYS if name not in skipped}
        with watch(busy_processes=1) as state:
            results = run_benchmark(subjects, capacity=CAPACITY, batch_size=BATCH, seconds=SECONDS, unavailable=skipped)
        others = state.report()["other_processes_cores"]
        return {name: {"skipped": skipped[name]} if name in skipped else
                {"metrics": {**results[name]["per_second"], "other_processes_cores": others}} for name in REPLAYS}

    def setup(self, cache: dict[str, Any], replay: str) -> None:
        self.rates = lookup(cache, replay)

    def track_add_one(self, cache, replay) -> float:
        return self.rates["add_1"]

    track_add_one.unit = "add(1) calls/s"

    def track_add_batch(self, cache, replay) -> float:
        return self.rates["add_batch"]

    track_add_batch.unit = f"add({BATCH}) calls/s"

    def track_sample(self, cache, replay) -> float:
        return self.rates["sample_cold"]

    track_sample.unit = f"sample({BATCH}) calls/s"

    def track_sample_hot(self, cache, replay) -> float:
        return self.rates["sample_hot"]

    track_sample_hot.unit = f"sample({BATCH}) calls/s, small memory"

    def track_update_priorities(self, cache, replay) -> float:
        return self.rates["update_cold"]

    track_update_priorities.unit = f"update_priorities({BATCH}) calls/s"

    def track_update_priorities_hot(self, cache, replay) -> float:
        return self.rates["update_hot"]

    track_update_priorities_hot.unit = f"update_priorities({BATCH}) calls/s, one index set"

    def track_update_priorities_learner(self, cache, replay) -> float:
        return self.rates["update_learner"]

    track_update_priorities_learner.unit = f"update_priorities({BATCH}) calls/s of the indices just sampled"

    def track_other_processes_cores(self, cache, replay) -> float:
        return self.rates["other_processes_cores"]

    track_other_processes_cores.unit = "cores other processes used while measuring (machine state)"

