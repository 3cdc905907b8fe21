"""Tabular Q-learning / SARSA: the C engine against the Python reference, the conformance kit
against defective engines, bad input, the runtime loop's bookkeeping, and learning (online and
offline) through the runner."""

from __future__ import annotations

import numpy as np
import pytest

from rlbench import _tabular
from rlbench.builtin.tabular_cpu import CpuTabularEngine
from rlbench.kit.tabular import TabularInputError
from rlbench.config import RunConfig
from rlbench.errors import RlbenchError
from rlbench.testing.tabular import check_tabular_engine, random_batch, reference_td_update


@pytest.fixture(autouse=True)
def dataset_cache(tmp_path_factory, monkeypatch):
    """Offline datasets go to one cache per test session, never to the user's ~/.cache."""
    monkeypatch.setenv("RLBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "rlbench-cache"))


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["qlearning", "sarsa"])
def test_c_engine_equals_the_python_reference_bit_for_bit(rule):
    rng = np.random.default_rng(7)
    engine = CpuTabularEngine(20, 4)
    expected = np.zeros((20, 4))
    for size in (1, 3, 1000, 5000):
        batch = random_batch(rng, size, 20, 4, done_fraction=0.1)
        engine.update(batch, rule=rule, alpha=0.25, gamma=0.97)
        reference_td_update(expected, batch, rule=rule, alpha=0.25, gamma=0.97)
    assert np.count_nonzero(expected) > 60  # the comparison is not between two empty tables
    assert np.array_equal(engine.q, expected)

    dataset = random_batch(rng, 2000, 20, 4)
    measured = engine.fit_offline(dataset, rule=rule, alpha=0.1, gamma=0.9, epochs=4)
    reference_td_update(expected, dataset, rule=rule, alpha=0.1, gamma=0.9, epochs=4)
    assert np.array_equal(engine.q, expected)
    assert measured["updates"] == 8000 and measured["timing"] == "measured" and measured["seconds"] >= 0


def test_cpu_engine_passes_the_conformance_kit():
    check_tabular_engine(CpuTabularEngine)


class ReversedOrder(CpuTabularEngine):
    def update(self, batch, *, rule, alpha, gamma):
        super().update({k: np.asarray(v)[::-1] for k, v in batch.items()}, rule=rule, alpha=alpha, gamma=gamma)


class IgnoresDone(CpuTabularEngine):
    def update(self, batch, *, rule, alpha, gamma):
        super().update({**batch, "done": np.zeros_like(np.asarray(batch["done"]))}, rule=rule, alpha=alpha, gamma=gamma)


class AllTargetsFromTheOldTable(CpuTabularEngine):
    """The tempting vectorised shortcut: every target reads the table as it was before the batch."""

    def update(self, batch, *, rule, alpha, gamma):
        obs, action, next_obs = (np.asarray(batch[k], dtype=np.int64) for k in ("obs", "action", "next_obs"))
        rows = self.q[next_obs]
        bootstrap = rows[np.arange(len(rows)), batch["next_action"]] if rule == "sarsa" else rows.max(axis=1)
        target = np.asarray(batch["reward"], np.float64) + gamma * np.where(batch["done"], 0.0, bootstrap)
        for i in range(len(obs)):
            self.q[obs[i], action[i]] += alpha * (target[i] - self.q[obs[i], action[i]])


class SarsaReadsTheMax(CpuTabularEngine):
    def update(self, batch, *, rule, alpha, gamma):
        super().update(batch, rule="qlearning", alpha=alpha, gamma=gamma)


class FitOfflineOneEpoch(CpuTabularEngine):
    def fit_offline(self, dataset, *, rule, alpha, gamma, epochs):
        return {**super().fit_offline(dataset, rule=rule, alpha=alpha, gamma=gamma, epochs=1), "updates": len(dataset["obs"]) * epochs}


class ClipsBadStates(CpuTabularEngine):
    """Silently clamps out-of-range ids instead of refusing them."""

    def update(self, batch, *, rule, alpha, gamma):
        clipped = {**batch, "obs": np.clip(np.asarray(batch["obs"]), 0, self.n_states - 1)}
        super().update(clipped, rule=rule, alpha=alpha, gamma=gamma)


@pytest.mark.parametrize("defective", [ReversedOrder, IgnoresDone, AllTargetsFromTheOldTable, SarsaReadsTheMax,
                                       FitOfflineOneEpoch, ClipsBadStates])
def test_conformance_kit_catches_a_defective_engine(defective):
    with pytest.raises(AssertionError):
        check_tabular_engine(defective)


def _good_batch():
    return {"obs": np.array([0, 1]), "action": np.array([1, 0]), "reward": np.array([1.0, -1.0]),
            "next_obs": np.array([1, 2]), "next_action": np.array([0, 1]), "done": np.array([False, True])}


@pytest.mark.parametrize("change, rule, message", [
    ({"obs": np.array([0, 3])}, "qlearning", "batch['obs'][1] = 3 is outside [0, 3)"),
    ({"next_obs": np.array([-2, 0])}, "qlearning", "batch['next_obs'][0] = -2 is outside [0, 3)"),
    ({"next_action": np.array([0, 9])}, "sarsa", "batch['next_action'][1] = 9 is outside [0, 2)"),
    ({"obs": np.array([2**40, 0])}, "qlearning", "outside [0, 3)"),  # must not wrap into range
    ({"action": np.array([0.0, 1.0])}, "qlearning", "must hold integers, got dtype float64"),
    ({"reward": np.array([1.0])}, "qlearning", "batch['reward'] must be 1-D real numbers with 2 rows"),
    ({"reward": np.array([np.inf, 0.0])}, "qlearning", "NaN or infinity"),
    ({"done": np.array([0.5, 1.0])}, "qlearning", "batch['done'] must be 1-D bool or integer"),
    ({"obs": np.array([[0, 1]])}, "qlearning", "must be 1-D"),
    ({}, "sarsa-lambda", "unknown tabular rule 'sarsa-lambda'; did you mean 'sarsa'?"),
])
def test_bad_input_gets_one_clear_line_and_leaves_the_table_alone(change, rule, message):
    engine = CpuTabularEngine(3, 2)
    engine.update(_good_batch(), rule="sarsa", alpha=0.5, gamma=0.9)
    before = engine.q.copy()
    with pytest.raises(TabularInputError) as error:
        engine.update({**_good_batch(), **change}, rule=rule, alpha=0.5, gamma=0.9)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert isinstance(error.value, RlbenchError)
    assert np.array_equal(engine.q, before)


def test_bad_hyperparameters_and_missing_keys_are_refused():
    engine = CpuTabularEngine(3, 2)
    with pytest.raises(TabularInputError, match="alpha must be in"):
        engine.update(_good_batch(), rule="qlearning", alpha=0.0, gamma=0.9)
    with pytest.raises(TabularInputError, match="gamma must be in"):
        engine.update(_good_batch(), rule="qlearning", alpha=0.1, gamma=1.5)
    with pytest.raises(TabularInputError, match="epochs must be >= 1"):
        engine.fit_offline(_good_batch(), rule="qlearning", alpha=0.1, gamma=0.9, epochs=0)
    without_next_action = {k: v for k, v in _good_batch().items() if k != "next_action"}
    with pytest.raises(TabularInputError, match="the sarsa batch lacks next_action"):
        engine.update(without_next_action, rule="sarsa", alpha=0.1, gamma=0.9)
    engine.update(without_next_action, rule="qlearning", alpha=0.1, gamma=0.9)  # qlearning does not need it
    with pytest.raises(TabularInputError, match="at least one state"):
        CpuTabularEngine(0, 4)


def test_the_c_module_refuses_bad_buffers_itself():
    """Called directly (no Python validation), it raises or reports; it never writes out of bounds."""
    q = np.zeros((3, 2))
    ids, reward, done = np.array([0, 1]), np.array([1.0, 2.0]), np.zeros(2, dtype=np.uint8)
    with pytest.raises(TypeError, match="obs must be int64"):
        _tabular.td_update(q, ids.astype(np.int32), ids, reward, ids, ids, done, True, 0.5, 0.9, 1)
    with pytest.raises(TypeError, match="q must be float64"):
        _tabular.td_update(q.astype(np.float32), ids, ids, reward, ids, ids, done, True, 0.5, 0.9, 1)
    with pytest.raises(ValueError, match="reward has 3 rows, obs has 2"):
        _tabular.td_update(q, ids, ids, np.zeros(3), ids, ids, done, True, 0.5, 0.9, 1)
    with pytest.raises(ValueError, match="needs next_action"):
        _tabular.td_update(q, ids, ids, reward, ids, None, done, True, 0.5, 0.9, 1)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _tabular.td_update(q[:, :1], ids, ids, reward, ids, ids, done, True, 0.5, 0.9, 1)  # not contiguous
    assert _tabular.td_update(q, ids, ids, reward, np.array([0, 7]), ids, done, True, 0.5, 0.9, 1) == ("next_obs", 1, 7)
    assert not q.any()


# ---------------------------------------------------------------------------------------------
# Algorithms and the runtime loop
# ---------------------------------------------------------------------------------------------
def _context(algo: str, env_id: str, steps: int, *, num_envs: int = 1, seed: int = 0, dataset=None, **hp):
    from rlbench.builtin.envs import GymnasiumEnv
    from rlbench.config import apply_overrides
    from rlbench.registry import load_object
    from rlbench.runtime.context import Budget, RunContext

    algorithm = load_object({"qlearning": "rlbench.algorithms.qlearning:QLearning",
                             "sarsa": "rlbench.algorithms.sarsa:Sarsa"}[algo])()
    config = RunConfig(algo=algo, env=env_id, steps=steps, seed=seed, num_envs=num_envs, dataset=dataset)
    return RunContext(config=config, algorithm=algorithm, hp=apply_overrides(algorithm.Config, hp),
                      env=GymnasiumEnv(env_id, num_envs=num_envs, seed=seed), compute=_cpu(), replay=None,
                      budget=Budget(total_steps=steps))


def _cpu():
    from rlbench.builtin.compute_cpu import CpuCompute

    return CpuCompute()


@pytest.mark.parametrize("algo", ["qlearning", "sarsa"])
def test_online_loop_accounts_for_every_transition(algo):
    from rlbench.runtime.local import run_tabular_loop

    ctx = _context(algo, "FrozenLake-v1", 3000, num_envs=3)
    stats = run_tabular_loop(ctx)
    ctx.env.close()
    assert stats.env_steps == 3000 and stats.updates == 3000 and stats.extra["mode"] == "online"
    assert ctx.accounting.to_dict()["balanced"] and ctx.accounting.stored == 3000
    assert ctx.recorder.histogram("learner.update").count == 1000  # one update per step of 3 envs
    assert len(ctx.curve.points) > 50 and sum(p["length"] for p in ctx.curve.points) <= 3000
    assert stats.extra["final_epsilon"] < 0.5  # the schedule spans the run's budget, not Config's
    assert ctx.actor.greedy(np.arange(16)).shape == (16,)
    assert ctx.actor.version == stats.updates and ctx.actor.q.any()


def test_actor_explores_then_follows_the_table():
    from rlbench.algorithms.qlearning import QLearning, QLearningConfig
    from rlbench.builtin.envs import GymnasiumEnv

    spec = GymnasiumEnv("Taxi-v3").spec
    config = QLearningConfig(total_steps=1000, epsilon_start=1.0, epsilon_end=0.0, exploration_fraction=0.5)
    actor = QLearning().make_actor(spec, _cpu(), config, seed=3)
    table = np.zeros((spec.n_states, spec.n_actions))
    table[:, 4] = 1.0
    actor.load_weights([table], 7)
    states = np.arange(spec.n_states)
    assert len(set(actor.act(states, 0).tolist())) == spec.n_actions  # epsilon 1: uniform over actions
    assert (actor.act(states, 500) == 4).all() and (actor.greedy(states) == 4).all()
    table[:, 4] = 0.0  # all tied: greedy acting breaks ties at random, evaluation picks the first
    actor.load_weights([table], 8)
    assert len(set(actor.act(states, 1000).tolist())) == spec.n_actions and (actor.greedy(states) == 0).all()


def test_offline_sarsa_can_sweep_the_recorded_next_action_exactly():
    """offline_next_action='dataset' is the SwiftRL engine job as is: one fit_offline call."""
    from rlbench import datasets
    from rlbench.runtime.local import run_tabular_loop

    ctx = _context("sarsa", "FrozenLake-v1", 0, dataset=5000, epochs=3, offline_next_action="dataset")
    stats = run_tabular_loop(ctx)
    dataset = datasets.get("FrozenLake-v1", 5000, seed=0)
    expected = np.zeros((16, 4))
    reference_td_update(expected, dataset.arrays, rule="sarsa", alpha=ctx.hp.alpha, gamma=ctx.hp.gamma, epochs=3)
    assert np.array_equal(ctx.actor.q, expected)
    assert stats.updates == 15000 and stats.samples == 15000 and ctx.accounting.to_dict()["balanced"]
    info = stats.extra["dataset"]
    assert info["size"] == 5000 and info["behaviour"] == "random" and info["path"].endswith(".npz")
    assert stats.extra["engine"]["epochs"] == 3


def test_unknown_offline_next_action_is_refused():
    ctx = _context("sarsa", "FrozenLake-v1", 0, dataset=100, offline_next_action="behaviour")
    from rlbench.runtime.local import run_tabular_loop

    with pytest.raises(RlbenchError, match="offline_next_action must be one of policy, dataset"):
        run_tabular_loop(ctx)


def test_tabular_algorithm_refuses_a_continuous_environment():
    from rlbench.algorithms.sarsa import Sarsa, SarsaConfig
    from rlbench.builtin.envs import GymnasiumEnv

    with pytest.raises(RlbenchError, match="CartPole-v1 has no discrete states"):
        Sarsa().make_learner(GymnasiumEnv("CartPole-v1").spec, _cpu(), SarsaConfig(), 0)


# ---------------------------------------------------------------------------------------------
# Learning, end to end through the runner (greedy evaluation over 200 episodes)
# ---------------------------------------------------------------------------------------------
def _run(**kwargs):
    from rlbench.runner import run

    return run(RunConfig(eval_episodes=200, seed=0, **kwargs))


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["qlearning", "sarsa"])
def test_online_learning_on_slippery_frozenlake(algo):
    result = _run(algo=algo, env="FrozenLake-v1", steps=100_000)
    assert result["evaluation"]["success_rate"] >= 0.6
    assert result["accounting"]["balanced"] and result["throughput"]["updates"] == 100_000


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["qlearning", "sarsa"])
def test_online_learning_on_taxi(algo):
    result = _run(algo=algo, env="Taxi-v3", steps=60_000, hyperparameters={"alpha": 0.5})
    assert result["evaluation"]["success_rate"] >= 0.9
    assert any("Taxi-v4" in note for note in result["notes"])  # the renamed id is said, not hidden


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["qlearning", "sarsa"])
def test_offline_learning_on_taxi_from_a_random_dataset(algo):
    """`rlbench run --algo sarsa --env Taxi-v3 --dataset 100000` with the default hyperparameters."""
    result = _run(algo=algo, env="Taxi-v3", dataset=100_000)
    assert result["evaluation"]["success_rate"] >= 0.9
    loop = result["loop"]
    assert loop["mode"] == "offline" and loop["dataset"]["size"] == 100_000
    assert loop["dataset"]["key"] == "Taxi-v3-100000-random-seed0"  # the name asked for
    assert result["throughput"]["updates"] == 100_000 * result["hyperparameters"]["epochs"]
