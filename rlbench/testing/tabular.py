"""Conformance of tabular engines (rlbench.protocols.TabularEngine) against a float64 reference.

    from rlbench.testing.tabular import check_tabular_engine
    check_tabular_engine(lambda n_states, n_actions: MyEngine(n_states, n_actions))

The reference is the textbook loop, one transition after another, each seeing every earlier update
of its batch. An engine that reorders, parallelises without care, ignores `done` or `next_action`,
drops updates or accepts bad input fails with a message saying which.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from rlbench.errors import RlbenchError

EngineFactory = Callable[[int, int], Any]


def reference_td_update(q: np.ndarray, batch: Mapping[str, np.ndarray], *, rule: str, alpha: float,
                        gamma: float, epochs: int = 1) -> None:
    """The specification, in pure Python float64: q is updated in place, in batch order."""
    table = q.tolist()  # Python floats: the fastest pure-Python loop, and IEEE float64 like C
    obs, action = batch["obs"].tolist(), batch["action"].tolist()
    reward, next_obs, done = batch["reward"].tolist(), batch["next_obs"].tolist(), batch["done"].tolist()
    next_action = batch["next_action"].tolist() if rule == "sarsa" else None
    for _ in range(epochs):
        for i in range(len(obs)):
            target = float(reward[i])
            if not done[i]:
                row = table[next_obs[i]]
                bootstrap = row[next_action[i]] if next_action is not None else max(row)
                target = target + gamma * bootstrap
            row = table[obs[i]]
            row[action[i]] = row[action[i]] + alpha * (target - row[action[i]])
    q[...] = table


def random_batch(rng: np.random.Generator, n: int, n_states: int, n_actions: int, *,
                 done_fraction: float = 0.2) -> dict[str, np.ndarray]:
    """Uniform random transitions in the dataset layout (int32 ids, float32 reward, uint8 done)."""
    return {
        "obs": rng.integers(n_states, size=n).astype(np.int32),
        "action": rng.integers(n_actions, size=n).astype(np.int32),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.integers(n_states, size=n).astype(np.int32),
        "next_action": rng.integers(n_actions, size=n).astype(np.int32),
        "done": (rng.random(n) < done_fraction).astype(np.uint8),
    }


def _batch(obs, action, reward, next_obs, next_action, done) -> dict[str, np.ndarray]:
    return {"obs": np.array(obs, dtype=np.int32), "action": np.array(action, dtype=np.int32),
            "reward": np.array(reward, dtype=np.float32), "next_obs": np.array(next_obs, dtype=np.int32),
            "next_action": np.array(next_action, dtype=np.int32), "done": np.array(done, dtype=np.uint8)}


def _table(engine: Any) -> np.ndarray:
    return np.array(engine.q, dtype=np.float64, copy=True)


def _assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float, what: str) -> None:
    if not np.allclose(actual, expected, rtol=rtol, atol=atol):
        worst = np.unravel_index(np.argmax(np.abs(actual - expected)), actual.shape)
        raise AssertionError(f"{what}: q{tuple(int(i) for i in worst)} = {actual[worst]!r}, "
                             f"the in-order reference gives {expected[worst]!r}")


def check_tabular_engine(factory: EngineFactory, *, rtol: float = 1e-12, atol: float = 1e-12) -> None:
    """Raise AssertionError on the first behaviour that differs from the reference.

    rtol/atol: how far from the float64 reference an engine may be (loosen for FP32 engines).
    """
    _check_table(factory)
    _check_semantics(factory, rtol, atol)
    _check_random_batches(factory, rtol, atol)
    _check_fit_offline(factory, rtol, atol)
    _check_bad_input(factory)


def _check_table(factory: EngineFactory) -> None:
    engine, other = factory(7, 3), factory(7, 3)
    q = engine.q
    assert isinstance(q, np.ndarray) and q.shape == (7, 3), f"q must be a (7, 3) array, got {getattr(q, 'shape', q)}"
    assert q.dtype == np.float64, f"q must be float64, got {q.dtype}"
    before, other_before = _table(engine), _table(other)
    engine.update(_batch([0], [0], [1.0], [1], [0], [1]), rule="qlearning", alpha=0.5, gamma=0.9)
    assert _table(engine)[0, 0] == before[0, 0] + 0.5 * (1.0 - before[0, 0]), "an update must show in engine.q"
    assert np.array_equal(_table(other), other_before), "two engines must not share a table"
    updated = _table(engine)
    engine.update(_batch([], [], [], [], [], []), rule="qlearning", alpha=0.5, gamma=0.9)
    assert np.array_equal(_table(engine), updated), "an empty batch must leave the table unchanged"


def _check_semantics(factory: EngineFactory, rtol: float, atol: float) -> None:
    alpha, gamma = 0.5, 0.9
    # Transition 1 bootstraps from the state transition 0 has just updated, within one batch.
    engine = factory(3, 2)
    start = _table(engine)
    chained = _batch([1, 0], [0, 0], [1.0, 0.0], [2, 1], [0, 0], [1, 0])
    engine.update(chained, rule="qlearning", alpha=alpha, gamma=gamma)
    expected = start.copy()
    reference_td_update(expected, chained, rule="qlearning", alpha=alpha, gamma=gamma)
    _assert_close(_table(engine), expected, rtol, atol,
                  "in-order semantics: transition 1 must see transition 0's update of the same batch")

    # done=1: the target is the reward alone, however large the next state's values are.
    engine = factory(3, 2)
    start = _table(engine)
    raise_next = _batch([1, 1], [0, 1], [10.0, 5.0], [2, 2], [0, 0], [1, 1])
    terminal = _batch([0], [0], [0.0], [1], [0], [1])
    for rule in ("qlearning", "sarsa"):
        engine.update(raise_next, rule=rule, alpha=alpha, gamma=gamma)
        engine.update(terminal, rule=rule, alpha=alpha, gamma=gamma)
        reference_td_update(start, raise_next, rule=rule, alpha=alpha, gamma=gamma)
        reference_td_update(start, terminal, rule=rule, alpha=alpha, gamma=gamma)
        _assert_close(_table(engine), start, rtol, atol, f"{rule}: a transition with done=1 must not bootstrap")

    # sarsa bootstraps from next_action's value, qlearning from the row's maximum.
    for rule in ("qlearning", "sarsa"):
        engine = factory(3, 2)
        start = _table(engine)
        batch = _batch([1, 1, 0], [0, 1, 0], [10.0, -5.0, 0.0], [2, 2, 1], [0, 0, 1], [1, 1, 0])
        engine.update(batch, rule=rule, alpha=alpha, gamma=gamma)
        reference_td_update(start, batch, rule=rule, alpha=alpha, gamma=gamma)
        what = "sarsa must bootstrap from q[next_obs, next_action]" if rule == "sarsa" else \
            "qlearning must bootstrap from max over q[next_obs]"
        _assert_close(_table(engine), start, rtol, atol, what)


def _check_random_batches(factory: EngineFactory, rtol: float, atol: float) -> None:
    rng = np.random.default_rng(1234)
    n_states, n_actions = 6, 3  # few states: many repeats and chains inside each batch
    for rule in ("qlearning", "sarsa"):
        engine = factory(n_states, n_actions)
        expected = _table(engine)
        for size in (1, 5, 64, 257):
            batch = random_batch(rng, size, n_states, n_actions)
            # Other accepted layouts: int64 ids (what environments return), bool done, float64 reward.
            if size == 64:
                batch = {**batch, "obs": batch["obs"].astype(np.int64), "done": batch["done"].astype(bool),
                         "reward": batch["reward"].astype(np.float64)}
            engine.update(batch, rule=rule, alpha=0.3, gamma=0.95)
            reference_td_update(expected, batch, rule=rule, alpha=0.3, gamma=0.95)
            _assert_close(_table(engine), expected, rtol, atol, f"{rule}: after a random batch of {size}")


def _check_fit_offline(factory: EngineFactory, rtol: float, atol: float) -> None:
    rng = np.random.default_rng(99)
    dataset = random_batch(rng, 500, 10, 4)
    for rule in ("qlearning", "sarsa"):
        engine = factory(10, 4)
        expected = _table(engine)
        measured = engine.fit_offline(dataset, rule=rule, alpha=0.2, gamma=0.9, epochs=3)
        reference_td_update(expected, dataset, rule=rule, alpha=0.2, gamma=0.9, epochs=3)
        _assert_close(_table(engine), expected, rtol, atol, f"{rule}: fit_offline(epochs=3) must be 3 in-order sweeps")
        assert isinstance(measured, dict), f"fit_offline must return a dict of what it measured, got {measured!r}"
        assert measured.get("updates") == 1500, f"fit_offline must report updates=1500 (500 x 3), got {measured!r}"


def _bad_inputs() -> list[tuple[str, dict[str, Any], str]]:
    good = _batch([0, 1], [0, 1], [1.0, 0.0], [1, 2], [1, 0], [0, 1])
    return [
        ("obs out of range", {**good, "obs": np.array([0, 5], dtype=np.int32)}, "sarsa"),
        ("negative next_obs", {**good, "next_obs": np.array([-1, 2], dtype=np.int32)}, "qlearning"),
        ("action out of range", {**good, "action": np.array([0, 2], dtype=np.int32)}, "qlearning"),
        ("next_action out of range", {**good, "next_action": np.array([2, 0], dtype=np.int32)}, "sarsa"),
        ("float obs", {**good, "obs": np.array([0.0, 1.0])}, "qlearning"),
        ("2-D obs", {**good, "obs": np.array([[0, 1]], dtype=np.int32)}, "qlearning"),
        ("reward of another length", {**good, "reward": np.zeros(3, dtype=np.float32)}, "qlearning"),
        ("NaN reward", {**good, "reward": np.array([np.nan, 0.0])}, "qlearning"),
        ("string done", {**good, "done": np.array(["no", "yes"])}, "qlearning"),
        ("sarsa without next_action", {k: v for k, v in good.items() if k != "next_action"}, "sarsa"),
        ("no reward", {k: v for k, v in good.items() if k != "reward"}, "qlearning"),
        ("unknown rule", good, "expected-sarsa"),
    ]


def _check_bad_input(factory: EngineFactory) -> None:
    engine = factory(3, 2)
    engine.update(_batch([0, 1], [0, 1], [1.0, 2.0], [1, 2], [0, 0], [0, 0]), rule="qlearning", alpha=0.5, gamma=0.9)
    before = _table(engine)
    for what, batch, rule in _bad_inputs():
        for call in ("update", "fit_offline"):
            try:
                if call == "update":
                    engine.update(batch, rule=rule, alpha=0.5, gamma=0.9)
                else:
                    engine.fit_offline(batch, rule=rule, alpha=0.5, gamma=0.9, epochs=2)
            except RlbenchError:
                pass
            else:
                raise AssertionError(f"{call} with {what} must raise an RlbenchError")
            assert np.array_equal(_table(engine), before), f"a rejected {call} ({what}) must leave the table unchanged"
