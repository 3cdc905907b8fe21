"""Conformance check for replay memories: `check_replay_memory(factory)`.

It drives a real memory through the `ReplayMemory` contract and raises AssertionError naming the
first thing that is wrong: storage (FIFO overwrite, indices, rows returned equal rows stored,
dtypes and shapes kept), refusal of bad input with an RlbenchError that leaves the memory
unchanged, and the sampling law. For a prioritized memory that law is tested statistically: 200,000
draws over 20 items with priorities spanning 0.1 to 8 must fit P(i) = p_i**alpha / sum p**alpha
(chi-square goodness of fit, failing below p = 1e-6, so a correct memory fails about once in a
million runs; give the factory a seed to make it reproducible), after `add` and again after
`update_priorities` (where a repeated index takes the last priority); importance weights must equal
(N P(i))**-beta / max_j (N P(j))**-beta with the maximum over the whole memory, which small
batches tell apart from a per-batch normalisation. A uniform memory must sample uniformly, also
after priority updates, and return weights of one.

A memory whose capabilities declare `frames` is built again as `factory(capacity, frames=k)` (so its
factory must pass options on) and fed image observations of small frames: several envs' streams
interleaved in batches of one step, of all envs and of one env's chunk of steps, episodes that end
anywhere and start with reset stacks of one frame repeated, the same reset frame in several envs, an
env whose next_obs is not its obs shifted by one, frames repeated within a stack, a batch longer than
the memory, many wraps of the ring. Every sampled obs and next_obs must be byte-identical to what was
added at its index (k = 4 and k = 1), a stack of the wrong depth is refused leaving the memory as it
was, and a checkpoint (when declared, with `state_dict`) restores the same samples.

A memory may hand out arrays that live on a device (torch tensors on a GPU, which numpy cannot
read): the kit compares every index, row and weight through a host copy it makes itself
(`rlbench.arrays.to_host`), so a memory is never asked to leave its device for the kit's sake.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from rlbench.arrays import to_host
from rlbench.errors import RlbenchError
from rlbench.protocols import ReplayCapabilities, ReplayMemory

P_VALUE_THRESHOLD = 1e-6  # a correct memory fails with probability below this (less when stratified)
DRAWS = 200_000
DRAW_BATCH = 1000
STAT_ITEMS = 20


def check_replay_memory(factory: Callable[..., Any], *, prioritized: bool | None = None,
                        alpha: float | None = None) -> dict[str, Any]:
    """Check the memories `factory(capacity)` builds; returns what was measured (p-values, and the
    frame checks made when the memory declares frames: then `factory(capacity, frames=k)` is called too).

    prioritized: what the memory must be (default: what its capabilities declare).
    alpha: its priority exponent (default: its `alpha` attribute; needed when prioritized).
    """
    memory = factory(8)
    assert isinstance(memory, ReplayMemory), f"{type(memory).__name__} lacks part of the ReplayMemory protocol"
    capabilities = memory.capabilities
    assert isinstance(capabilities, ReplayCapabilities), "capabilities must be a ReplayCapabilities"
    if prioritized is None:
        prioritized = capabilities.prioritized
    assert capabilities.prioritized == prioritized, (
        f"capabilities declare prioritized={capabilities.prioritized}, expected {prioritized}")
    fields = _fields(capabilities)
    slot_item = _check_storage(memory, fields, prioritized)
    _check_bad_input(memory, fields, prioritized, slot_item)
    report: dict[str, Any] = {"prioritized": prioritized}
    if prioritized:
        if alpha is None:
            alpha = getattr(memory, "alpha", None)
        assert alpha is not None, "pass alpha=... (the memory has no `alpha` attribute)"
        report["alpha"] = float(alpha)
        report["p_values"] = _check_prioritized_law(factory, fields, float(alpha))
    else:
        report["p_values"] = _check_uniform_law(factory, fields)
    if capabilities.frames:
        report["frames"] = _check_frames(factory, capabilities)
    return report


# -- transitions whose every value tells which item it is --------------------------------------------
FIELD_SPECS = {  # name: (dtype, trailing shape)
    "obs": ("float32", (3,)),
    "action": ("int64", ()),
    "reward": ("float32", ()),
    "done": ("bool", ()),
    "pixels": ("uint8", (2, 2)),
    "value": ("float64", ()),
    "step": ("int32", ()),
}


def _fields(capabilities: ReplayCapabilities) -> dict[str, tuple[str, tuple[int, ...]]]:
    fields = {name: spec for name, spec in FIELD_SPECS.items() if spec[0] in capabilities.dtypes}
    assert fields, f"capabilities.dtypes {capabilities.dtypes} holds none of {sorted({s[0] for s in FIELD_SPECS.values()})}"
    return fields


def _rows(fields: dict[str, tuple[str, tuple[int, ...]]], items: np.ndarray) -> dict[str, np.ndarray]:
    items = np.asarray(items, dtype=np.int64)
    values = {
        "obs": items[:, None] + np.array([0.0, 0.25, 0.5]),
        "action": 1000 + items,
        "reward": items * 0.5,
        "done": items % 2 == 1,
        "pixels": (items[:, None] * 3 + np.arange(4)).reshape(-1, 2, 2) % 251,
        "value": items * 1.5 - 7.0,
        "step": -items,
    }
    return {name: values[name].astype(dtype).reshape(len(items), *shape) for name, (dtype, shape) in fields.items()}


def _check_rows(fields: dict[str, Any], sample: Any, slot_item: dict[int, int], batch_size: int) -> np.ndarray:
    """Shapes, dtypes, and each row equal to what was stored at its index; returns the items."""
    indices = to_host(sample.indices)
    assert indices.dtype == np.int64 and indices.shape == (batch_size,), (
        f"Sample.indices must be int64 of shape ({batch_size},), got {indices.dtype}{list(indices.shape)}")
    unknown = sorted({int(i) for i in indices} - set(slot_item))
    assert not unknown, f"sampled indices {unknown[:5]} hold no stored item (stored: {sorted(slot_item)})"
    assert set(sample.transitions) == set(fields), (
        f"sampled fields {sorted(sample.transitions)} differ from the stored {sorted(fields)}")
    items = np.array([slot_item[int(i)] for i in indices], dtype=np.int64)
    expected = _rows(fields, items)
    for name, (dtype, shape) in fields.items():
        got = to_host(sample.transitions[name])
        assert got.dtype == np.dtype(dtype) and got.shape == (batch_size, *shape), (
            f"field {name!r}: sampled {getattr(got, 'dtype', type(got))}{list(getattr(got, 'shape', []))}, "
            f"stored {dtype}{[batch_size, *shape]}")
        wrong = np.flatnonzero(~np.all((got == expected[name]).reshape(batch_size, -1), axis=1))
        assert wrong.size == 0, (
            f"field {name!r}: the row sampled at index {int(indices[wrong[0]])} is not the row stored there "
            f"(got {got[wrong[0]]!r}, stored {expected[name][wrong[0]]!r})")
    weights = to_host(sample.weights)
    assert weights.dtype == np.float32 and weights.shape == (batch_size,), (
        f"Sample.weights must be float32 of shape ({batch_size},), got {weights.dtype}{list(weights.shape)}")
    assert np.all(np.isfinite(weights)) and np.all(weights > 0) and np.all(weights <= 1 + 1e-6), (
        f"importance weights must lie in (0, 1] (max-normalised), got range [{weights.min()}, {weights.max()}]")
    return items


def _add(memory: Any, fields: dict[str, Any], items: range | list[int], slot_item: dict[int, int],
         priorities: np.ndarray | None = None) -> np.ndarray:
    items = list(items)
    indices = memory.add(_rows(fields, np.array(items)), priorities)
    indices = to_host(indices)
    assert np.issubdtype(indices.dtype, np.integer) and indices.shape == (len(items),), (
        f"add() must return one integer index per item, got {indices.dtype}{list(indices.shape)}")
    assert np.all((indices >= 0) & (indices < memory.capacity)), f"add() returned indices {indices} outside [0, capacity)"
    for index, item in zip(indices, items):
        slot_item[int(index)] = item
    return indices


# -- storage -------------------------------------------------------------------------------------------
def _check_storage(memory: Any, fields: dict[str, Any], prioritized: bool) -> dict[int, int]:
    """Fills a memory of capacity 8 past full; returns which item each index holds."""
    assert memory.capacity == 8, f"factory(8) built a memory of capacity {memory.capacity}"
    assert len(memory) == 0, f"a new memory holds {len(memory)} items"
    slot_item: dict[int, int] = {}
    first = np.concatenate([_add(memory, fields, range(0, 3), slot_item), _add(memory, fields, [3], slot_item),
                            _add(memory, fields, range(4, 6), slot_item)])
    assert len(set(first.tolist())) == 6, f"add() gave the same index to different items while not full: {first}"
    assert len(memory) == 6, f"after adding 6 items len() is {len(memory)}"
    _check_rows(fields, memory.sample(64, 0.4), slot_item, 64)
    oldest = [int(i) for i in first[:3]]
    later = _add(memory, fields, range(6, 11), slot_item)  # 11 items in a memory of 8
    assert len(memory) == 8, f"a full memory of capacity 8 reports len() {len(memory)}"
    assert [int(i) for i in later[2:]] == oldest, (
        f"FIFO: items 8, 9, 10 must overwrite the oldest items' indices {oldest}, got {later[2:].tolist()}")
    items = _check_rows(fields, memory.sample(256, 0.4), slot_item, 256)
    assert items.min() >= 3, "sampled an item that FIFO overwrite should have removed"
    assert set(items.tolist()) == set(range(3, 11)), (
        f"256 draws from 8 equally likely items missed some: saw {sorted(set(items.tolist()))}")
    if not prioritized:
        assert np.all(to_host(memory.sample(32, 0.7).weights) == 1.0), "a uniform memory must return weights of 1"
    memory.update_priorities(np.array(sorted(slot_item)[:4]), np.array([0.5, 1.0, 2.0, 0.1]))
    stats = memory.stats()
    assert isinstance(stats, dict), f"stats() must return a dict, got {type(stats).__name__}"
    return slot_item


# -- bad input -----------------------------------------------------------------------------------------
def _expect_refusal(memory: Any, what: str, call: Callable[[], Any]) -> None:
    size = len(memory)
    try:
        call()
    except RlbenchError as error:
        assert "\n" not in str(error).strip(), f"{what}: the error message should be one line, got {str(error)!r}"
    except Exception as error:  # noqa: BLE001 - we report what was raised instead
        raise AssertionError(f"{what}: raised {type(error).__name__} ({error}), expected an RlbenchError") from None
    else:
        raise AssertionError(f"{what}: accepted, expected an RlbenchError")
    assert len(memory) == size, f"{what}: refused, but len() changed from {size} to {len(memory)}"


def _check_bad_input(memory: Any, fields: dict[str, Any], prioritized: bool, slot_item: dict[int, int]) -> None:
    """Every refusal is an RlbenchError and leaves the (full) memory as it was."""
    rows = _rows(fields, np.arange(100, 102))
    name, (dtype, shape) = next(iter(fields.items()))
    other_dtype = "float64" if dtype != "float64" else "float32"
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("sample(0)", lambda: memory.sample(0, 0.4)),
        ("sample(-3)", lambda: memory.sample(-3, 0.4)),
        ("add() missing a field", lambda: memory.add({k: v for k, v in rows.items() if k != name})),
        ("add() with an extra field", lambda: memory.add({**rows, "extra": np.zeros(2, np.float32)})),
        (f"add() with field {name!r} as {other_dtype}", lambda: memory.add({**rows, name: rows[name].astype(other_dtype)})),
        (f"add() with field {name!r} of another shape",
         lambda: memory.add({**rows, name: np.zeros((2, *shape, 2), dtype)})),
        ("add() with fields of different lengths", lambda: memory.add({**rows, name: rows[name][:1]})),
        ("update_priorities with an index past the end",
         lambda: memory.update_priorities(np.array([0, memory.capacity + 5]), np.array([1.0, 1.0]))),
        ("update_priorities with a negative index", lambda: memory.update_priorities(np.array([-1]), np.array([1.0]))),
        ("update_priorities with 2 indices and 1 priority",
         lambda: memory.update_priorities(np.array([0, 1]), np.array([1.0]))),
    ]
    if prioritized:
        cases += [
            ("update_priorities with a negative priority",
             lambda: memory.update_priorities(np.array([0, 1]), np.array([1.0, -0.5]))),
            ("update_priorities with a NaN priority",
             lambda: memory.update_priorities(np.array([0]), np.array([np.nan]))),
            ("add() with a negative priority", lambda: memory.add(rows, np.array([1.0, -1.0]))),
        ]
    for what, call in cases:
        _expect_refusal(memory, what, call)
    _check_rows(fields, memory.sample(256, 0.4), slot_item, 256)


# -- sampling law ---------------------------------------------------------------------------------------
def chi_square_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularized upper incomplete gamma Q(dof/2, statistic/2)."""
    if statistic <= 0:
        return 1.0
    return _upper_gamma_q(dof / 2.0, statistic / 2.0)


def _upper_gamma_q(a: float, x: float) -> float:
    log_prefactor = a * math.log(x) - x - math.lgamma(a)  # log(x**a e**-x / Gamma(a))
    if x < a + 1.0:
        # Series for the lower function: P = x**a e**-x / Gamma(a+1) * sum_n x**n / ((a+1)...(a+n)).
        term = total = 1.0 / a
        n = 0
        while abs(term) > abs(total) * 1e-16 and n < 10_000:
            n += 1
            term *= x / (a + n)
            total += term
        return max(0.0, 1.0 - math.exp(log_prefactor) * total)
    # Continued fraction for Q = x**a e**-x / Gamma(a) * 1 / (x+1-a - 1(1-a)/(x+3-a - 2(2-a)/(x+5-a - ...))),
    # evaluated by the modified Lentz method.
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    fraction = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        fraction *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(log_prefactor) * fraction


def _chi_square_p(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = probabilities * counts.sum()
    statistic = float(np.sum((counts - expected) ** 2 / expected))
    return chi_square_sf(statistic, len(counts) - 1)


def _draw(memory: Any, fields: dict[str, Any], slot_item: dict[int, int], beta: float) -> tuple[np.ndarray, list]:
    """Counts per item over DRAWS samples (rows of every batch checked), and each batch's (items, weights)."""
    counts = np.zeros(STAT_ITEMS, dtype=np.int64)
    batches = []
    for _ in range(DRAWS // DRAW_BATCH):
        sample = memory.sample(DRAW_BATCH, beta)
        items = _check_rows(fields, sample, slot_item, DRAW_BATCH)
        counts += np.bincount(items, minlength=STAT_ITEMS)
        batches.append((items, to_host(sample.weights)))
    return counts, batches


def _check_law(memory: Any, fields: dict[str, Any], slot_item: dict[int, int], beta: float, law: np.ndarray,
               expected_weight: Callable[[np.ndarray, float], np.ndarray], what: str) -> float:
    """The sampling distribution first (the more basic fault), then every batch's weights."""
    counts, batches = _draw(memory, fields, slot_item, beta)
    p_value = _assert_fits(counts, law, what)
    for items, weights in batches:
        _check_weights(weights, expected_weight(items, beta), beta)
    return p_value


def _check_weights(weights: np.ndarray, expected: np.ndarray, beta: float) -> None:
    if not np.allclose(weights, expected, rtol=1e-4, atol=1e-7):
        worst = int(np.argmax(np.abs(weights - expected)))
        raise AssertionError(
            f"importance weights (beta={beta}) differ from (N P(i))**-beta / max over the memory: "
            f"got {weights[worst]:.6g}, expected {expected[worst]:.6g}")


def _assert_fits(counts: np.ndarray, law: np.ndarray, what: str) -> float:
    p_value = _chi_square_p(counts, law)
    assert p_value >= P_VALUE_THRESHOLD, (
        f"{what}: {counts.sum()} draws do not follow the expected distribution (chi-square p={p_value:.3g}); "
        f"expected shares {np.round(law, 4).tolist()}, observed {np.round(counts / counts.sum(), 4).tolist()}")
    return p_value


def _skewed_priorities(seed: int) -> np.ndarray:
    """Priorities spanning two orders of magnitude, in shuffled order, the largest above 1."""
    values = 0.1 * 80.0 ** (np.arange(STAT_ITEMS) / (STAT_ITEMS - 1))
    return np.random.default_rng(seed).permutation(values)


def _check_prioritized_law(factory: Callable[[int], Any], fields: dict[str, Any], alpha: float) -> list[float]:
    memory = factory(32)
    _expect_refusal(memory, "sample() on an empty memory", lambda: memory.sample(4, 0.4))
    slot_item: dict[int, int] = {}
    raw = _skewed_priorities(seed=1)
    # Items 0..18 come with priorities; item 19 with none, so it takes the largest seen so far.
    _add(memory, fields, range(0, 10), slot_item, raw[:10])
    _add(memory, fields, range(10, 19), slot_item, raw[10:19])
    _add(memory, fields, [19], slot_item)
    raw = raw.copy()
    raw[19] = raw[:19].max()
    item_slot = {item: slot for slot, item in slot_item.items()}
    p_values = []

    def law() -> np.ndarray:
        scaled = raw ** alpha
        return scaled / scaled.sum()

    def expected_weight(items: np.ndarray, beta: float) -> np.ndarray:
        probabilities = law()
        weights = (STAT_ITEMS * probabilities[items]) ** -beta
        return weights / (STAT_ITEMS * probabilities.min()) ** -beta

    p_values.append(_check_law(memory, fields, slot_item, 0.5, law(), expected_weight,
                               f"prioritized sampling after add (alpha={alpha})"))
    # New priorities, with one index given twice: the last value given must win.
    raw = _skewed_priorities(seed=2)
    twice = int(np.argmax(raw))
    slots = np.array([item_slot[i] for i in range(STAT_ITEMS)] + [item_slot[twice]], dtype=np.int64)
    given = np.append(raw, raw.min() / 2)
    memory.update_priorities(slots, given)
    raw[twice] = raw.min() / 2
    p_values.append(_check_law(memory, fields, slot_item, 1.0, law(), expected_weight,
                               f"prioritized sampling after update_priorities (alpha={alpha}, repeated index: last wins)"))
    # Small batches rarely hold the least likely item: a per-batch normalisation shows here.
    for beta in (0.0, 0.4, 1.0):
        for _ in range(50):
            sample = memory.sample(4, beta)
            items = _check_rows(fields, sample, slot_item, 4)
            _check_weights(to_host(sample.weights), expected_weight(items, beta), beta)
    return p_values


def _check_uniform_law(factory: Callable[[int], Any], fields: dict[str, Any]) -> list[float]:
    memory = factory(32)
    _expect_refusal(memory, "sample() on an empty memory", lambda: memory.sample(4, 0.4))
    slot_item: dict[int, int] = {}
    _add(memory, fields, range(STAT_ITEMS), slot_item, _skewed_priorities(seed=1))
    uniform = np.full(STAT_ITEMS, 1.0 / STAT_ITEMS)
    ones = lambda items, beta: np.ones(len(items))  # noqa: E731
    p_values = [_check_law(memory, fields, slot_item, 0.4, uniform, ones, "uniform sampling")]
    memory.update_priorities(np.array(sorted(slot_item)), _skewed_priorities(seed=2))
    p_values.append(_check_law(memory, fields, slot_item, 1.0, uniform, ones, "uniform sampling after update_priorities"))
    return p_values


# -- frames (capabilities.frames) --------------------------------------------------------------------
FRAME_CAPACITY = 16
FRAME_STEPS = 120  # steps of each env: the ring of 16 wraps many times
FRAME_ENVS = 3  # env 2's next_obs is not its obs shifted by one


def _frame_memory(factory: Callable[..., Any], capacity: int, k: int) -> Any:
    try:
        return factory(capacity, frames=k)
    except TypeError as error:
        if "frames" not in str(error):
            raise
        raise AssertionError(f"capabilities declare frames=True, but factory(capacity, frames={k}) is refused "
                             f"({error}): pass a factory that forwards options, e.g. "
                             "lambda capacity, **options: Memory(capacity, seed=0, **options)") from None


def _frame_batches(k: int, frame_shape: tuple[int, ...], seed: int) -> list[dict[str, np.ndarray]]:
    """Batches of interleaved env streams whose every value is checkable (see the module docstring)."""
    rng = np.random.default_rng(seed)
    resets = rng.integers(0, 256, (2, *frame_shape), dtype=np.uint8)  # few: envs reset to the same frames

    def new_frame() -> np.ndarray:
        if rng.random() < 0.15:  # a frame seen before in this stack (a still screen, a flicker)
            return rng.integers(0, 2, frame_shape, dtype=np.uint8)
        return rng.integers(0, 256, frame_shape, dtype=np.uint8)

    def reset() -> np.ndarray:
        first = resets[rng.integers(0, len(resets))]
        return np.stack([first] * k) if k > 1 else first.copy()

    stacks = [reset() for _ in range(FRAME_ENVS)]
    steps: list[list[tuple]] = [[] for _ in range(FRAME_ENVS)]
    for step in range(FRAME_STEPS):
        for env in range(FRAME_ENVS):
            obs = stacks[env]
            if env == 2:  # next_obs unrelated to obs
                following = np.stack([new_frame() for _ in range(k)]) if k > 1 else new_frame()
            else:
                following = np.concatenate([obs[1:], new_frame()[None]]) if k > 1 else new_frame()
            done = rng.random() < 0.08
            steps[env].append((obs, env * 1000 + step, following, done))
            stacks[env] = reset() if done else following

    def batch(rows: list[tuple]) -> dict[str, np.ndarray]:
        obs, ids, following, done = zip(*rows)
        ids = np.array(ids, dtype=np.int64)
        return {"obs": np.stack(obs), "action": ids, "reward": ids.astype(np.float32) * 0.5,
                "next_obs": np.stack(following), "done": np.array(done, dtype=np.float32)}

    batches, step = [], 0
    while step < FRAME_STEPS:
        shape = rng.integers(0, 3)
        if shape == 0:  # one step of every env
            batches.append(batch([steps[env][step] for env in range(FRAME_ENVS)]))
            step += 1
        elif shape == 1:  # each env alone, in turn
            batches.extend(batch([steps[env][step]]) for env in rng.permutation(FRAME_ENVS))
            step += 1
        else:  # a chunk of consecutive steps per env, as actors send them
            end = min(FRAME_STEPS, step + int(rng.integers(2, 7)))
            batches.extend(batch(steps[env][step:end]) for env in range(FRAME_ENVS))
            step = end
    everything = [row for env in range(FRAME_ENVS) for row in steps[env][-FRAME_CAPACITY - 4:]]
    batches.append(batch(everything))  # longer than the memory: only its last items stay
    return batches


def _stand_in_batch(obs_shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    n = obs_shape[0]
    return {"obs": np.zeros(obs_shape, np.uint8), "action": np.zeros(n, np.int64), "reward": np.zeros(n, np.float32),
            "next_obs": np.zeros(obs_shape, np.uint8), "done": np.zeros(n, np.float32)}


def _check_frame_rows(memory: Any, stored: dict[int, dict[str, np.ndarray]], batch_size: int, what: str) -> Any:
    sample = memory.sample(batch_size, 0.4)
    indices = to_host(sample.indices)
    for name in ("obs", "next_obs", "action", "reward", "done"):
        got = to_host(sample.transitions[name])
        for row, index in enumerate(indices):
            expected = stored[int(index)][name]
            assert got.dtype == expected.dtype and got.shape[1:] == expected.shape, (
                f"{what}: field {name!r} sampled as {got.dtype}{list(got.shape[1:])}, added as "
                f"{expected.dtype}{list(expected.shape)}")
            assert np.array_equal(got[row], expected), (
                f"{what}: the {name} sampled at index {int(index)} is not the one added there (differs at "
                f"{np.argwhere(got[row] != expected)[:3].tolist()})")
    return sample


def _check_frames(factory: Callable[..., Any], capabilities: ReplayCapabilities) -> dict[str, Any]:
    assert "uint8" in capabilities.dtypes, f"capabilities declare frames but not uint8 among dtypes {capabilities.dtypes}"
    checked = {}
    for k, frame_shape in ((4, (6, 5)), (1, (4, 3, 2))):
        what = f"frames={k}"
        memory = _frame_memory(factory, FRAME_CAPACITY, k)
        stored: dict[int, dict[str, np.ndarray]] = {}
        if k > 1:  # the first add fixes the layout: a stack of another depth must be refused, fixing nothing
            shallow = _stand_in_batch((2, k - 1, *frame_shape))
            _expect_refusal(memory, f"{what}: a first add() of stacks of {k - 1} frames", lambda: memory.add(shallow))
        batches = _frame_batches(k, frame_shape, seed=k)
        for number, batch in enumerate(batches):
            indices = to_host(memory.add(batch))
            kept = len(indices) - min(len(indices), FRAME_CAPACITY)
            for row, index in enumerate(indices[kept:], start=kept):
                stored[int(index)] = {name: values[row].copy() for name, values in batch.items()}
            sample = _check_frame_rows(memory, stored, 32, f"{what}, after add {number}")
            if number % 5 == 0 and capabilities.prioritized:  # priorities per transition change nothing stored
                memory.update_priorities(to_host(sample.indices), np.linspace(0.5, 2.0, 32))
        assert len(memory) == FRAME_CAPACITY, f"{what}: after {len(batches)} adds len() is {len(memory)}"
        other = _stand_in_batch((2, k + 1, *frame_shape) if k > 1 else (2, 1, *frame_shape))
        _expect_refusal(memory, f"{what}: add() of observations of another shape", lambda: memory.add(other))
        _check_frame_rows(memory, stored, 64, f"{what}, after a refused add")
        if capabilities.checkpoints and hasattr(memory, "state_dict"):  # (the kit does not check checkpoints otherwise)
            restored = _frame_memory(factory, FRAME_CAPACITY, k)
            restored.load_state_dict(memory.state_dict())
            a = _check_frame_rows(memory, stored, 64, f"{what}, the saved memory")
            b = _check_frame_rows(restored, stored, 64, f"{what}, restored from its state_dict")
            assert np.array_equal(to_host(a.indices), to_host(b.indices)), (
                f"{what}: a memory restored from a checkpoint draws other indices than the saved one")
        checked[f"frames={k}"] = f"{len(batches)} batches, exact"
    return checked
