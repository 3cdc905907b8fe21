"""Issue #24 item 4: replay sharded over several replay nodes (--replay-shards N): actors hashed to
shards, the learner drawing each batch across them by priority mass so that the sampling law (and
the importance weights) are one memory's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rlbench.builtin.replay import PrioritizedReplay
from rlbench.config import RunConfig
from rlbench.errors import RlbenchError
from rlbench.metrics import Recorder
from rlbench.protocols import EnvSpec
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.messages import Op
from rlbench.runtime.distributed.replay_client import ReplayClient
from rlbench.runtime.distributed.shards import ShardedReplayClient, apportion, budgets, shard_of_actor

ALPHA, BETA = 0.6, 0.4


def test_a_batch_is_stratified_over_the_shards_concatenated_mass():
    rng = np.random.default_rng(0)
    assert list(apportion(4, [1.0, 1.0], rng)) == [2, 2]  # one draw per quarter of the mass: exact
    assert list(apportion(8, [3.0, 0.0, 1.0], rng)) == [6, 0, 2]
    counts = sum(apportion(10, [1.0, 2.5, 6.5], rng) for _ in range(2000))
    np.testing.assert_allclose(counts / counts.sum(), [0.1, 0.25, 0.65], atol=0.01)


def test_shards_share_the_budget_as_their_actors_do_and_a_replacement_keeps_its_shard():
    assert budgets(10_000, 3, 2) == [6667, 3333]  # actors 0, 2 on shard 0; actor 1 on shard 1
    assert sum(budgets(10_001, 5, 3)) == 10_001
    assert shard_of_actor(4, 2) == shard_of_actor(0, 2) == 0


class _ShardChannel:
    """A replay node's SAMPLE and UPDATE_PRIORITIES on a local memory, answered as the node's BATCH
    with its priority mass (ReplayNode._batch with several shards)."""

    def __init__(self, memory: PrioritizedReplay) -> None:
        self.memory, self.recorder, self.stats = memory, Recorder(), {}

    def begin(self, op, arrays):
        sample = self.memory.sample(int(arrays["batch_size"]), float(arrays["beta"]))
        mass, min_mass = self.memory.priority_mass()
        return {"indices": sample.indices, "weights": sample.weights, **sample.transitions, "step": np.int64(0),
                "mass": mass, "min_mass": min_mass}

    def finish(self, batch):
        return Op.BATCH, batch

    def send(self, op, arrays):
        assert op == Op.UPDATE_PRIORITIES
        if len(arrays["indices"]):
            self.memory.update_priorities(arrays["indices"], arrays["priorities"])


def _memories(priorities: list[np.ndarray]) -> list[PrioritizedReplay]:
    memories = []
    for shard, values in enumerate(priorities):
        memory = PrioritizedReplay(len(values), alpha=ALPHA, seed=shard)
        ids = np.arange(len(values), dtype=np.float32) + 1000 * shard  # which item it is, in its obs
        memory.add({"obs": ids[:, None], "action": np.zeros(len(values), np.int64),
                    "reward": np.zeros(len(values), np.float32), "next_obs": ids[:, None],
                    "done": np.zeros(len(values), np.float32)}, values)
        memories.append(memory)
    return memories


def test_across_shards_items_are_drawn_and_weighted_as_one_memory_would():
    rng = np.random.default_rng(1)
    priorities = [rng.uniform(0.05, 4.0, 30), rng.uniform(0.5, 1.0, 20), rng.uniform(0.01, 9.0, 10)]
    client = ShardedReplayClient([ReplayClient(_ShardChannel(m)) for m in _memories(priorities)], seed=3)
    ids = np.concatenate([np.arange(len(p)) + 1000 * s for s, p in enumerate(priorities)])
    powered = np.concatenate(priorities) ** ALPHA
    law = dict(zip(ids, powered / powered.sum()))  # one memory holding them all: P(i)
    expected_weights = dict(zip(ids, (powered / powered.min()) ** -BETA))  # (N P(i))**-b / max_j (N P(j))**-b
    drawn: Counter = Counter()
    batches = 3000
    for _ in range(batches):
        sample = client.sample(32, BETA)
        items = sample.transitions["obs"][:, 0].astype(int)
        drawn.update(items.tolist())
        np.testing.assert_allclose(sample.weights, [expected_weights[i] for i in items], rtol=1e-5)
    total = 32 * batches
    for item, p in law.items():  # within 5 standard deviations of the binomial count
        assert abs(drawn[item] - total * p) <= 5 * np.sqrt(total * p * (1 - p)) + 1, (item, drawn[item], total * p)


def test_priority_updates_go_back_to_the_shard_each_item_came_from():
    memories = _memories([np.ones(8), np.ones(8)])
    client = ShardedReplayClient([ReplayClient(_ShardChannel(m)) for m in memories], seed=0)
    sample = client.sample(16, BETA)
    shard_of_row = sample.transitions["obs"][:, 0] >= 1000
    client.update_priorities(sample.indices, np.where(shard_of_row, 5.0, 0.25), learner_updates=1)
    for shard, memory in enumerate(memories):
        rows = sample.indices[shard_of_row == bool(shard)]
        np.testing.assert_allclose(memory.priorities(rows), (5.0 if shard else 0.25) ** ALPHA, rtol=1e-6)


def test_shards_are_refused_where_batches_cannot_be_drawn_across_them():
    from rlbench.plugins import get_registry
    from rlbench.runner import check

    def refused(match: str, **kw):
        values = dict(placement="server", transport="tcp", actors=2, replay_shards=2)
        values.update(kw)
        with pytest.raises(RlbenchError, match=match):
            check(RunConfig(**values), get_registry())

    refused("at least 1", replay_shards=0)
    refused("--placement server only.*in-network", placement="in-network")
    refused("every shard needs an actor", actors=1)
    refused("memmap does not say its priority mass.*that can: uniform, prioritized", replay="memmap")


def test_a_sharded_run_stores_each_actors_transitions_on_its_shard_and_samples_them_all(tmp_path):
    from rlbench.runner import run
    from rlbench.runtime import checkpoint

    result = run(RunConfig(placement="server", transport="tcp", actors=3, replay_shards=2, steps=3000, eval_episodes=1,
                           hyperparameters={"learning_starts": 200, "batch_size": 32}, checkpoint_every=0.3,
                           checkpoint_dir=str(tmp_path / "ckpt"), out=None))
    assert result["status"] == "complete", result["status_reason"]
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["dropped"] == 0 and accounting["produced"] >= 3000
    shards = result["loop"]["replay_shards"]
    assert set(shards["replay"]["stored_by"]) == {"actor-0", "actor-2"}
    assert set(shards["replay-1"]["stored_by"]) == {"actor-1"}
    assert sum(s["stored"] for s in shards.values()) == accounting["stored"]
    assert shards["replay"]["produced"] >= 2000 and shards["replay-1"]["produced"] >= 1000  # budgets: 2000, 1000
    for shard in shards.values():  # the learner drew from both
        assert shard["rate_limiter"]["samples"] > 0
    assert result["throughput"]["updates"] > 100
    newest = checkpoint.latest(tmp_path / "ckpt")  # every shard's part in each checkpoint
    assert newest["shards"] == 2
    assert {p.name for p in Path(newest["path"]).iterdir()} == {"learner.pt", "replay.npz", "replay-1.npz"}


# Issue #42 item 4a: a shard's BATCH carries its memory's priority mass (mass, min_mass) besides the rows; the
# pre-start size check left them out, 48 B short, so a transport set to the size the refusal recommends
# refused the first sharded batch mid-run (MessageTooLargeError).
CARTPOLE = EnvSpec(id="CartPole-v1", num_envs=1, observation_shape=(4,), observation_dtype="float32",
                   action_kind="discrete", n_actions=2)


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_size_check_counts_a_shards_batch_as_the_node_encodes_it(fast_path):
    from support import served, valid_insert
    from test_hardening import connected

    batch_size = 32
    checked = messages.message_sizes(CARTPOLE, None, insert_rows=1, batch_size=batch_size, shards=2)["BATCH"]
    assert checked > messages.message_sizes(CARTPOLE, None, insert_rows=1, batch_size=batch_size)["BATCH"]
    # the node and its peers at exactly the checked size, as a run at the refusal's recommended limit
    with served("tcp", transport_options={"max_message_bytes": checked}, max_message_bytes=checked, shards=2,
                fast_path=fast_path) as (transport, listener, node):
        actor, learner = connected(transport, listener, "actor"), connected(transport, listener, "learner")
        actor.request(Op.INSERT, valid_insert(batch_size))
        op, batch = learner.request(Op.SAMPLE, {"batch_size": batch_size, "beta": 0.4})
        assert op == Op.BATCH and {"mass", "min_mass"} <= set(batch)
        assert len(messages.joined(messages.encode(Op.BATCH, dict(batch)))) == checked
        assert (node.fast is not None) == fast_path
        actor.close()
        learner.close()
