"""A run's replay sharded over several replay nodes (--replay-shards N), as the learner sees it.

Actors are hashed to shards (actor i inserts into shard i mod N); each node holds its own memory
(the run's capacity split between them), rate limiter and share of the env-step budget. The learner
samples each batch across the shards so that the sampling law of one memory holding everything is
unchanged:

- P(i) = p_i**alpha / sum_j p_j**alpha over all shards. A batch of B is stratified over the shards'
  concatenated priority mass, as one memory stratifies over its items: draw k falls at
  (k + U_k) / B of the total mass, and the shard whose range holds it serves it; each shard then
  draws its share from its own memory proportionally. So E[draws of item i] = B P(i), as in one memory.
- Importance weights (N P(i))**-beta / max_j (N P(j))**-beta reduce to (p_i / p_min)**-beta with the
  smallest priority over all shards; a shard's node normalises by its own smallest one, so its
  weights are rescaled here by (min_s / min_all)**-beta.
- The masses are each node's after its last draw (BATCH carries them), so a batch is split by masses
  at most one learner step old (a single node draws against its own current mass; actors insert in
  between either way). Before a shard has answered, shards count equally.

A shard whose budget is done answers END; the learner goes on with the others until every shard has
ended. Weights are published to every shard (actors fetch from their own). Priority updates go back
to the shard each item came from.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from rlbench.protocols import Sample
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.messages import Op
from rlbench.runtime.distributed.replay_client import ReplayClient
from rlbench.runtime.transitions import fields_of


def shard_of_actor(index: int, shards: int) -> int:
    """Actor i inserts into shard i mod N: hashing by identity, so a replacement keeps its slot's shard."""
    return index % shards


def budgets(total_steps: int, actors: int, shards: int) -> list[int]:
    """Each shard's share of the env-step budget, in proportion to the actors hashed to it (so shards
    end together), summing to the run's budget."""
    per_shard = [sum(1 for i in range(actors) if shard_of_actor(i, shards) == s) for s in range(shards)]
    shares = [total_steps * n // actors for n in per_shard]
    for s in range(total_steps - sum(shares)):
        shares[s % shards] += 1
    return shares


def apportion(batch_size: int, masses: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """How many of a stratified batch of `batch_size` draws fall in each shard's range of the
    concatenated mass (shards of mass 0 get none)."""
    masses = np.asarray(masses, dtype=np.float64)
    total = masses.sum()
    points = (np.arange(batch_size) + rng.random(batch_size)) / batch_size * total
    shard = np.searchsorted(np.cumsum(masses), points, side="right")
    return np.bincount(np.minimum(shard, len(masses) - 1), minlength=len(masses))


class ShardedReplayClient:
    """The learner's replay client over several shards: the same calls as ReplayClient's learner half."""

    def __init__(self, clients: list[ReplayClient], seed: int) -> None:
        self.clients = clients
        self.rng = np.random.default_rng(seed)
        self.masses = np.ones(len(clients))  # equal until each shard has said
        self.min_masses = np.full(len(clients), np.inf)
        self.ended = np.zeros(len(clients), dtype=bool)
        self.steps = np.zeros(len(clients), dtype=np.int64)
        self.finished = False
        self._segments: list[tuple[int, int, int]] = []  # (shard, start, end) of the last batch's rows
        self.recorder = clients[0].recorder

    @property
    def step(self) -> int:
        return int(self.steps.sum())

    def sample(self, batch_size: int, beta: float) -> Sample | None:
        started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
        while True:
            live = np.where(self.ended, 0.0, self.masses)
            if not live.any():
                if self.ended.all():
                    self.finished = True
                    self._took(started, cpu_started)
                    return None
                live = np.where(self.ended, 0.0, 1.0)  # the live shards' masses are all zero so far
            counts = apportion(batch_size, live, self.rng)
            pending = [(s, int(n), self.clients[s].channel.begin(Op.SAMPLE, {"batch_size": int(n), "beta": float(beta)}))
                       for s, n in enumerate(counts) if n]
            parts, ended_now = [], False
            for s, n, request in pending:
                op, arrays = self.clients[s].channel.finish(request)
                if op != Op.BATCH:
                    self.ended[s] = ended_now = True
                    continue
                self.steps[s] = int(arrays["step"])
                self.masses[s], self.min_masses[s] = float(arrays["mass"]), float(arrays["min_mass"])
                parts.append((s, {name: np.array(value) for name, value in messages.unshifted(arrays).items()}))
            if not ended_now:
                break
            # a shard ended mid-batch: what the others served is a part of a batch only; draw it again
            # from the live shards (what was drawn is not used: the learner never saw it)
        self._took(started, cpu_started)
        return self._merged(parts, beta)

    def _merged(self, parts: list[tuple[int, dict[str, np.ndarray]]], beta: float) -> Sample:
        smallest = self.min_masses[~self.ended].min()
        self._segments, start, weights = [], 0, []
        for s, arrays in parts:
            n = len(arrays["indices"])
            self._segments.append((s, start, start + n))
            start += n
            scale = (self.min_masses[s] / smallest) ** -beta if beta and np.isfinite(smallest) else 1.0
            weights.append(arrays["weights"].astype(np.float64) * scale)
        indices = np.concatenate([arrays["indices"] for _, arrays in parts])
        transitions = {name: np.concatenate([fields_of(arrays)[name] for _, arrays in parts])
                       for name in fields_of(parts[0][1])}
        return Sample(indices, transitions, np.concatenate(weights).astype(np.float32))

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, *, learner_updates: int,
                          credit: int | None = None, beta: float | None = None) -> None:
        """Each item's new priority to the shard it came from (every shard hears the update count)."""
        sent = set()
        for s, start, end in self._segments:
            has_priorities = len(priorities) > 0
            self.clients[s].update_priorities(indices[start:end] if has_priorities else indices[:0],
                                              priorities[start:end] if has_priorities else priorities,
                                              learner_updates=learner_updates)
            sent.add(s)
        for s, client in enumerate(self.clients):
            if s not in sent and not self.ended[s]:
                client.update_priorities(indices[:0], priorities[:0], learner_updates=learner_updates)

    def publish_params(self, weights: Sequence[np.ndarray], version: int) -> None:
        for client in self.clients:
            client.publish_params(weights, version)

    def checkpoint(self, number: int) -> int:
        """Every shard writes its part of checkpoint `number`; returns the env steps they hold together."""
        return sum(client.checkpoint(number) for client in self.clients)

    def _took(self, started: int, cpu_started: int) -> None:
        self.clients[0]._took("replay.SAMPLE", started, cpu_started)

    def blocked_s(self) -> dict[str, float]:
        return _summed(client.blocked_s() for client in self.clients)

    def cpu_s(self) -> dict[str, float]:
        return _summed(client.cpu_s() for client in self.clients)

    def link_stats(self) -> dict[str, int]:
        return {key: int(value) for key, value in _summed(client.link_stats() for client in self.clients).items()}

    @property
    def weights_traffic(self) -> dict[str, int]:
        """Every shard's (weights are published to each)."""
        return _summed(client.weights_traffic for client in self.clients)

    def bye(self, report: dict[str, Any]) -> None:
        for client in self.clients:
            client.bye(report)

    def close(self) -> None:
        for client in self.clients:
            client.close()


def _summed(dicts) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for values in dicts:
        for key, value in values.items():
            if isinstance(value, (int, float)):
                total[key] = total.get(key, 0) + value
    return total
