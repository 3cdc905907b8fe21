"""check_environment: does a batched environment keep rlbench's `Environment` contract? Like gymnasium's
`check_env`, for environments built by `factory(num_envs=N, seed=S, **options)`, gymnasium or not.

    from rlbench.testing import check_environment
    check_environment("chain")                                    # a registered environment
    check_environment(MyEnv, capabilities=CAPABILITIES, options={"length": 12},
                      expect=lambda env: env.spec.n_states == 12)

It raises AssertionError naming the first thing wrong, in this order:
- the spec: `num_envs`, a coherent description of observations and actions (continuous ones are
  floating point; images are uint8 of two or more dimensions, channels first, and a frame stack is
  their first axis), and the registered EnvironmentCapabilities (action and observation kinds;
  max_episode_steps and reward_threshold where declared);
- options: an unknown keyword option is refused (TypeError, ValueError or RlbenchError naming it),
  so a run option whose parameter the factory does not take fails loudly instead of vanishing into
  a `**options` catch-all. With `expect`, `expect(env)` is true for an environment built with
  `options` and false for one built without them: the options reach the environment;
- reset and step return what the spec says: num_envs rows, the observation shape and dtype, state
  ids within n_states, finite observations and rewards, bool terminated and truncated;
- every valid action is accepted (each discrete id; continuous actions anywhere within the bounds,
  the bounds included) and bad ones are refused with an RlbenchError or ValueError: a wrong number of
  rows, a wrong trailing shape, an id outside 0..n_actions-1, a value outside the bounds, NaN, each
  bad value in the last row, the first and a middle one in turn. A refused step changes nothing: its
  other rows hold valid actions that would move their copies (not 0, which may leave a copy as it
  is), the refusals are made max_episode_steps times (an episode clock that counts them would then
  truncate the next step), and after them the whole rest of the run must be the same as without
  them (a step counter or a random draw shows up later, not at once);
- arrays handed out are not changed by later calls (the runtime keeps the last observations while
  it steps again);
- frame stacks (spec.frame_stack = k): within an episode each observation is the previous one shifted
  by a frame, the newest last (obs[t+1][:k-1] == obs[t][1:]), in final_observations too;
- same-step auto-reset: where no episode ended, final_observations == observations; no episode lasts
  longer than max_episode_steps (where declared); and over the run's episode ends (at least
  MIN_ENDS of them), observations may not always equal final_observations: either the copy was not
  reset, or its final observation was replaced by the next episode's first (a valid environment
  repeats the state an episode ended in as the next one's start now and then, never every time);
- determinism: after reset(seed=s) the run depends on s and the actions alone (the same on a second
  reset(seed=s), and on another instance built with another seed). Where the copies of one batch
  behave differently under identical actions the environment is random, and reset(seed=s+1) must
  then change the run (otherwise the seed is ignored); a deterministic environment skips that part;
- close() twice is harmless;
- when the environment exposes its gymnasium copies as `env.envs` (as rlbench's gymnasium adapter
  does), gymnasium's own `check_env` on one of them.

Observations may be torch tensors (a device environment); they are copied to the host to be checked.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from rlbench.arrays import to_host
from rlbench.errors import RlbenchError
from rlbench.protocols import EnvironmentCapabilities, EnvSpec

MIN_ENDS = 8  # episode ends needed before judging the auto-reset from them
MAX_CLOCK_REFUSALS = 10_000  # refused steps the kit makes to push an episode clock that counts them past its limit
UNKNOWN_OPTION = "rlbench_check_unknown_option"
_REFUSALS = (RlbenchError, ValueError)


@dataclass
class EnvironmentReport:
    """What was checked, and what was not and why (a check never skips silently)."""

    checked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    stochastic: bool = False  # the copies of a batch diverged under identical actions
    episode_ends: int = 0  # in the main run


@dataclass
class _Run:
    """A run's outputs, copied to the host: the reset observations, then one tuple per step."""

    reset: np.ndarray
    steps: list[tuple[np.ndarray, ...]]


STEP_FIELDS = ("observations", "rewards", "terminated", "truncated", "final_observations")


def check_environment(factory: Callable[..., Any] | str, *, capabilities: EnvironmentCapabilities | None = None,
                      options: dict[str, Any] | None = None, expect: Callable[[Any], bool] | None = None,
                      num_envs: int = 4, seed: int = 0, steps: int | None = None) -> EnvironmentReport:
    """Check the environments `factory` builds; return what was checked and what was skipped.

    factory: `factory(num_envs=N, seed=S, **options)` returning an Environment, or the name of a
        registered environment (its factory and capabilities then come from the registry).
    capabilities: the EnvironmentCapabilities it is registered with (None: not compared).
    options: keyword options every environment of the check is built with.
    expect: `expect(env) -> bool`, true when `options` took effect (e.g. `lambda env:
        env.spec.n_states == 12`) and false for an environment built without them.
    num_envs: copies per batch (at least 2: copies are compared with each other).
    steps: the length of each run (default: four episodes of max_episode_steps, at most 2000 steps).
    """
    if isinstance(factory, str):
        import rlbench

        component = rlbench.get_registry().get("environment", factory)
        factory, capabilities = component.create, capabilities or component.capabilities
    assert num_envs >= 2, "num_envs must be at least 2: copies are compared with each other"
    options = dict(options or {})
    assert expect is None or options, "expect= checks that options= took effect; give options too"
    report = EnvironmentReport()

    def build(n: int = num_envs, construct_seed: int = seed, with_options: bool = True, **extra: Any) -> Any:
        return factory(num_envs=n, seed=construct_seed, **(options if with_options else {}), **extra)

    with _built(build) as env:
        spec = env.spec
        _check_spec(spec, num_envs, capabilities)
        report.checked.append("spec" + (" against the capabilities" if capabilities else ""))
        if capabilities is None:
            report.skipped.append("capabilities: none given, the spec was not compared with them")
        _check_options(build, env, spec, options, expect, report)
        limit = spec.max_episode_steps
        steps = steps or (min(4 * limit + 8, 2000) if limit else 1000)
        rng = np.random.default_rng(seed)
        actions = [_valid_actions(spec, rng, num_envs, include_bounds=(k == 0)) for k in range(steps)]
        run = _check_run(env, spec, seed, actions, report)
        _check_determinism(env, build, spec, seed, actions, run, report)
        _check_bad_actions(env, spec, seed, actions, run, report)
        report.checked.append("bad actions refused, without side effects")
        env.close()
        try:
            env.close()
        except Exception as exc:
            raise AssertionError(f"{spec.id}: close() a second time raised {type(exc).__name__} ({exc}); "
                                 "closing twice must be harmless") from None
        report.checked.append("close() twice")
    with _built(lambda: build(1)) as single:
        assert single.spec.num_envs == 1, f"{spec.id}: built with num_envs=1, its spec says {single.spec.num_envs}"
        _observations(single.spec, 1, single.reset(seed=seed), "reset() with num_envs=1")
        _check_step(single.spec, 1, single.step(_valid_actions(single.spec, rng, 1)), "step() with num_envs=1")
        report.checked.append("num_envs=1")
        _check_with_gymnasium(single, report)
    return report


@contextlib.contextmanager
def _built(make: Callable[[], Any]) -> Iterator[Any]:
    env = make()
    try:
        yield env
    except BaseException:
        with contextlib.suppress(Exception):  # the failure already raised is the one to report
            env.close()
        raise
    env.close()


# -- the spec ------------------------------------------------------------------------------------------
def _check_spec(spec: Any, num_envs: int, capabilities: EnvironmentCapabilities | None) -> None:
    assert isinstance(spec, EnvSpec), f"env.spec must be an rlbench.protocols.EnvSpec, got {type(spec).__name__}"
    name = spec.id
    assert spec.num_envs == num_envs, f"{name}: built with num_envs={num_envs}, its spec says {spec.num_envs}"
    try:
        dtype = np.dtype(spec.observation_dtype)
    except TypeError:
        raise AssertionError(f"{name}: observation_dtype {spec.observation_dtype!r} is not a numpy dtype") from None
    if spec.n_states is not None:
        assert isinstance(spec.n_states, int) and spec.n_states >= 1, f"{name}: n_states must be an int >= 1"
        assert spec.observation_shape == () and dtype.kind in "iu", (
            f"{name}: discrete observations (n_states set) are integer ids of shape (), got "
            f"{spec.observation_dtype}{list(spec.observation_shape)}")
    elif spec.observation_kind == "image":
        assert len(spec.observation_shape) in (2, 3), \
            f"{name}: image observations are (height, width) or (channels, height, width), got {spec.observation_shape}"
    else:
        assert dtype.kind == "f", (f"{name}: continuous observations must be floating point (images: uint8 of two or "
                                   f"more dimensions), got {spec.observation_dtype}{list(spec.observation_shape)}")
    stack = spec.frame_stack
    assert isinstance(stack, int) and stack >= 0, f"{name}: frame_stack must be an int >= 0, got {stack!r}"
    if stack:
        assert spec.observation_kind == "image" and len(spec.observation_shape) == 3 and \
            spec.observation_shape[0] == stack, (
                f"{name}: frame_stack={stack} stacks frames on axis 0 of an image observation, but observations are "
                f"{spec.observation_dtype}{list(spec.observation_shape)}")
    assert spec.action_kind in ("discrete", "continuous"), f"{name}: unknown action_kind {spec.action_kind!r}"
    if spec.action_kind == "discrete":
        assert isinstance(spec.n_actions, int) and spec.n_actions >= 1, f"{name}: discrete actions need n_actions >= 1"
        assert spec.action_shape == (), f"{name}: a discrete action is one id (action_shape ()), got {spec.action_shape}"
    else:
        size = int(np.prod(spec.action_shape, dtype=np.int64))
        for bound in ("action_low", "action_high"):
            value = getattr(spec, bound)
            assert value is not None and len(value) == size, \
                f"{name}: continuous actions need {bound} with {size} values (action_shape {spec.action_shape})"
        low, high = _bounds(spec)
        assert not (np.isnan(low).any() or np.isnan(high).any()) and (low <= high).all(), \
            f"{name}: action bounds [{spec.action_low}, {spec.action_high}] are not ordered"
    if spec.max_episode_steps is not None:
        assert isinstance(spec.max_episode_steps, int) and spec.max_episode_steps >= 1, \
            f"{name}: max_episode_steps must be an int >= 1, or None"
    if capabilities is None:
        return
    declared = {"action_space": (capabilities.action_space, spec.action_kind),
                "observation_space": (capabilities.observation_space, spec.observation_kind)}
    if capabilities.max_episode_steps is not None:
        declared["max_episode_steps"] = (capabilities.max_episode_steps, spec.max_episode_steps)
    if capabilities.reward_threshold is not None:
        declared["reward_threshold"] = (capabilities.reward_threshold, spec.reward_threshold)
    for what, (claimed, actual) in declared.items():
        assert claimed == actual, f"{name}: the capabilities declare {what}={claimed!r}, the environment has {actual!r}"


def _bounds(spec: EnvSpec) -> tuple[np.ndarray, np.ndarray]:
    shape = spec.action_shape
    return (np.asarray(spec.action_low, np.float64).reshape(shape),
            np.asarray(spec.action_high, np.float64).reshape(shape))


# -- options -------------------------------------------------------------------------------------------
def _check_options(build: Callable[..., Any], env: Any, spec: EnvSpec, options: dict[str, Any],
                   expect: Callable[[Any], bool] | None, report: EnvironmentReport) -> None:
    try:
        stray = build(1, **{UNKNOWN_OPTION: 1})
    except (TypeError, *_REFUSALS) as exc:
        assert UNKNOWN_OPTION in str(exc), f"{spec.id}: an unknown option was refused, but the error does not name it: {exc}"
    else:
        stray.close()
        raise AssertionError(f"{spec.id}: the factory accepted an unknown keyword option ({UNKNOWN_OPTION}=1) and "
                             "ignored it; refuse unknown keywords (no **options catch-all), or a run option whose "
                             "parameter the factory does not take vanishes silently")
    report.checked.append("unknown options refused")
    if expect is None:
        if options:
            report.skipped.append(f"options {options}: not shown to take effect (pass expect=)")
        return
    assert expect(env), f"{spec.id}: built with options {options}, expect(env) is false: the options did not take effect"
    with _built(lambda: build(with_options=False)) as plain:
        assert not expect(plain), (
            f"{spec.id}: expect(env) is true without options {options} too, so it does not show that they reach "
            "the environment; make it test what they change")
    report.checked.append(f"options {sorted(options)} reach the environment")


# -- actions -------------------------------------------------------------------------------------------
def _valid_actions(spec: EnvSpec, rng: np.random.Generator, n: int, include_bounds: bool = False) -> np.ndarray:
    """Random valid actions; with include_bounds, the first row takes the lowest action and the last
    row the highest (the bounds themselves must be accepted)."""
    if spec.action_kind == "discrete":
        actions = rng.integers(spec.n_actions, size=n, dtype=np.int64)
        if include_bounds:
            actions[0], actions[-1] = 0, spec.n_actions - 1
        return actions
    low, high = _bounds(spec)
    span = np.where(np.isfinite(high - low), high - low, 2.0)
    start = np.where(np.isfinite(low), low, np.where(np.isfinite(high), high - span, -1.0))
    actions = np.clip(start + rng.random((n, *spec.action_shape)) * span, low, high)
    if include_bounds:
        actions[0] = np.where(np.isfinite(low), low, actions[0])
        actions[-1] = np.where(np.isfinite(high), high, actions[-1])
    single = actions.astype(np.float32)
    # float32 rounding may step over a bound that float32 cannot hold exactly: step back inside.
    single = np.where(single > high, np.nextafter(single, np.float32(-np.inf)), single)
    return np.where(single < low, np.nextafter(single, np.float32(np.inf)), single).astype(np.float32)


def _moving_actions(spec: EnvSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """Valid actions that would move the copies: discrete ids from 1 on, each id in turn (0 is often
    "do nothing"), or random values within the bounds."""
    if spec.action_kind == "discrete":
        return (np.arange(n, dtype=np.int64) + 1) % spec.n_actions
    return _valid_actions(spec, rng, n)


def _bad_actions(spec: EnvSpec, valid: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(what is wrong, actions); a bad value sits in one row, the last, a middle one or the first in
    turn (an environment that moves its copies in some order as it checks each row has moved the others
    by the time it reaches the bad one, whichever it reaches last), the other rows hold `valid` actions
    (one row per copy) that would move their copies."""
    n = len(valid)
    extra = np.concatenate([valid, valid[:1]])
    rows = sorted({n - 1, n // 2, 0}, reverse=True)  # the last row, a middle one, the first

    def in_each_row(what: str, value: float, where: np.ndarray | None = None) -> list[tuple[str, np.ndarray]]:
        """A case per row of `rows`: `value` in that row (continuous: its first element where `where` holds)."""
        cases = []
        for row in rows:
            actions = valid.copy()
            if where is None:
                actions[row] = value
            else:
                elements = actions.reshape(n, -1)[row]  # a view: the copy is contiguous
                elements[np.flatnonzero(where.reshape(-1))[:1]] = value
            cases.append((f"{what} in row {row} of {n}", actions))
        return cases

    if spec.action_kind == "discrete":
        return [(f"{n + 1} rows of actions for {n} copies", extra),
                (f"{n - 1} rows of actions for {n} copies", valid[:-1].copy()),
                ("actions of shape (num_envs, 2)", np.repeat(valid[:, None], 2, axis=1)),
                *in_each_row(f"action id {spec.n_actions} (out of range 0..{spec.n_actions - 1})", spec.n_actions),
                *in_each_row("action id -1 (out of range)", -1)]
    low, high = _bounds(spec)
    size = int(np.prod(spec.action_shape, dtype=np.int64))
    cases = [(f"{n + 1} rows of actions for {n} copies", extra),
             (f"{n - 1} rows of actions for {n} copies", valid[:-1].copy()),
             (f"actions of shape (num_envs, {size + 1})",
              np.concatenate([valid.reshape(n, -1), valid.reshape(n, -1)[:, :1]], axis=1)),
             *in_each_row("a NaN action", np.nan, np.ones(low.shape, bool))]
    if np.isfinite(high).any():
        value = float(high[np.isfinite(high)].flat[0])
        cases += in_each_row(f"action {value + max(1.0, abs(value))} (above the bound {value})",
                             value + max(1.0, abs(value)), np.isfinite(high))
    if np.isfinite(low).any():
        value = float(low[np.isfinite(low)].flat[0])
        cases += in_each_row(f"action {value - max(1.0, abs(value))} (below the bound {value})",
                             value - max(1.0, abs(value)), np.isfinite(low))
    return cases


def _check_bad_actions(env: Any, spec: EnvSpec, seed: int, actions: list[np.ndarray], run: _Run,
                       report: EnvironmentReport) -> None:
    """Each bad action refused; then the refusals made again until they number max_episode_steps (an
    episode clock that counts a refused step is then past the limit, and the next step truncates every
    copy, where the episodes of a run under random actions may never live long enough to show a few
    steps' difference); then the whole rest of the run must be what it was without them."""
    env.reset(seed=seed)
    env.step(actions[0])
    moving = _moving_actions(spec, np.random.default_rng(seed + 1), spec.num_envs)
    cases = _bad_actions(spec, moving)
    limit = spec.max_episode_steps
    refusals = len(cases)
    if limit is not None and limit <= MAX_CLOCK_REFUSALS:
        refusals = max(refusals, limit)
        report.checked.append(f"{refusals} refused steps leave the episode clock (max_episode_steps={limit}) as it was")
    elif limit is not None:
        report.skipped.append(f"the episode clock on refused steps: max_episode_steps={limit} is more refusals than "
                              f"the kit makes ({MAX_CLOCK_REFUSALS})")
    for k in range(refusals):
        what, bad = cases[k % len(cases)]
        try:
            env.step(bad)
        except _REFUSALS as exc:
            assert str(exc), f"{spec.id}: {what} was refused with an empty message"
        except Exception as exc:
            raise AssertionError(f"{spec.id}: {what} raised {type(exc).__name__} ({exc}), not an RlbenchError "
                                 "or ValueError") from None
        else:
            raise AssertionError(f"{spec.id}: step() accepted {what}; refuse it with an RlbenchError or ValueError")
    for k in range(1, len(actions)):  # the whole rest of the run: a changed counter or draw shows up later
        after = _check_step(spec, spec.num_envs, env.step(actions[k]), f"step {k}, after refused ones")
        difference = _step_difference(after, run.steps[k])
        assert difference is None, (
            f"{spec.id}: a refused step changed the environment: step {k}'s {difference} differ from the same run "
            "without it (check every row's action before stepping any copy)")


# -- outputs -------------------------------------------------------------------------------------------
def _observations(spec: EnvSpec, n: int, value: Any, where: str) -> np.ndarray:
    array = to_host(value)
    assert isinstance(array, np.ndarray), f"{spec.id}: {where} returned {type(value).__name__}, not an array"
    expected = (n, *spec.observation_shape)
    assert array.shape == expected, \
        f"{spec.id}: {where} returned observations of shape {array.shape}; the spec says {expected} (num_envs, *observation_shape)"
    assert array.dtype == np.dtype(spec.observation_dtype), \
        f"{spec.id}: {where} returned observations of dtype {array.dtype}; the spec says {spec.observation_dtype}"
    if spec.n_states is not None:
        outside = array[(array < 0) | (array >= spec.n_states)]
        assert not outside.size, f"{spec.id}: {where} returned state {outside[0]}, outside 0..{spec.n_states - 1}"
    else:
        assert np.isfinite(array).all(), f"{spec.id}: {where} returned NaN or infinite observations"
    return array


def _check_step(spec: EnvSpec, n: int, result: Any, where: str) -> tuple[np.ndarray, ...]:
    """The step's arrays (on the host), in STEP_FIELDS order, each checked against the spec."""
    missing = [name for name in STEP_FIELDS if not hasattr(result, name)]
    assert not missing, f"{spec.id}: {where} returned {type(result).__name__} without {', '.join(missing)} (a StepResult)"
    observations = _observations(spec, n, result.observations, f"{where} (observations)")
    final = _observations(spec, n, result.final_observations, f"{where} (final_observations)")
    rewards = to_host(result.rewards)
    assert rewards.shape == (n,) and rewards.dtype.kind in "fiu", \
        f"{spec.id}: {where} returned rewards {rewards.dtype}{list(rewards.shape)}; expected {n} real numbers"
    assert np.isfinite(rewards).all(), f"{spec.id}: {where} returned a NaN or infinite reward"
    flags = []
    for name in ("terminated", "truncated"):
        flag = to_host(getattr(result, name))
        assert flag.shape == (n,) and flag.dtype == np.bool_, \
            f"{spec.id}: {where} returned {name} {flag.dtype}{list(flag.shape)}; expected {n} bools (a mask over the copies)"
        flags.append(flag)
    return observations, rewards, flags[0], flags[1], final


def _same_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b).reshape(len(a), -1).all(axis=1)


def _check_run(env: Any, spec: EnvSpec, seed: int, actions: list[np.ndarray], report: EnvironmentReport) -> _Run:
    """The main run: outputs against the spec, buffers never rewritten, auto-reset and episode limits."""
    n, limit = spec.num_envs, spec.max_episode_steps
    # Where episodes start: the observations of a few seeded resets.
    starts = {row.tobytes() for k in range(16) for row in to_host(env.reset(seed=seed + 1000 + k))}
    returned = _observations(spec, n, env.reset(seed=seed), "reset(seed)")
    run = _Run(returned.copy(), [])
    held, kept = [returned], [returned.copy()]
    lengths = np.zeros(n, np.int64)
    ends = repeated = 0
    repeated_finals: list[bytes] = []
    reached_limit = False
    for k, action in enumerate(actions):
        where = f"step {k}"
        outputs = _check_step(spec, n, env.step(action), where)
        for array, copy in zip(held, kept):
            assert np.array_equal(array, copy), (
                f"{spec.id}: {where} changed arrays an earlier call returned: the environment reuses its buffers "
                "(hand out fresh arrays; the runtime keeps the last observations while it steps again)")
        held, kept = list(outputs), [array.copy() for array in outputs]
        previous = run.steps[-1][0] if run.steps else run.reset
        run.steps.append(tuple(kept))
        observations, _, terminated, truncated, final = kept
        ended = terminated | truncated
        if spec.frame_stack:
            shifted = _same_rows(final[:, :-1], previous[:, 1:])
            if not shifted.all():
                row = int(np.flatnonzero(~shifted)[0])
                raise AssertionError(
                    f"{spec.id}: {where}: copy {row}'s frame stack is not the previous observation's shifted by one "
                    f"frame (frame_stack={spec.frame_stack}: within an episode obs[t+1][:-1] == obs[t][1:], the newest "
                    "frame last)")
        same = _same_rows(observations, final)
        if not same[~ended].all():
            row = int(np.flatnonzero(~same & ~ended)[0])
            raise AssertionError(f"{spec.id}: {where}: copy {row}'s episode did not end, yet its final_observations "
                                 "differ from its observations (they must be equal there)")
        lengths += 1
        if limit is not None:
            over = ~ended & (lengths >= limit)
            assert not over.any(), (
                f"{spec.id}: {where}: copy {int(np.flatnonzero(over)[0])} ran {limit} steps and was not truncated; "
                f"an episode ends at max_episode_steps={limit}")
            reached_limit |= bool((ended & (lengths == limit)).any())
        lengths[ended] = 0
        ends += int(ended.sum())
        repeated += int((ended & same).sum())
        repeated_finals.extend(row.tobytes() for row in final[ended & same])
    report.episode_ends = ends
    if ends < MIN_ENDS:
        report.skipped.append(f"auto-reset: {ends} episode(s) ended in {len(actions)} steps, fewer than the "
                              f"{MIN_ENDS} needed to judge it (pass steps=)")
    elif repeated == ends:
        if all(final in starts for final in repeated_finals):
            raise AssertionError(
                f"{spec.id}: in all {ends} episode ends, final_observations equal the next episode's first "
                "observation: the state each episode ended in is lost (final_observations must hold it, and "
                "observations the start of the next episode)")
        raise AssertionError(
            f"{spec.id}: in all {ends} episode ends, observations repeat final_observations: the copies were not "
            "reset (same-step auto-reset: observations must be the next episode's first)")
    else:
        report.checked.append(f"same-step auto-reset over {ends} episode ends")
    if limit is not None:
        if reached_limit:
            report.checked.append(f"truncation at max_episode_steps={limit}")
        else:
            report.skipped.append(f"truncation: no episode reached max_episode_steps={limit} under random actions "
                                  "(none ran past it either)")
    report.checked.append(f"reset/step outputs and buffers over {len(actions)} steps of {n} copies")
    if spec.frame_stack:
        report.checked.append(f"frame stacks of {spec.frame_stack} shift by one frame a step")
    return run


# -- determinism ---------------------------------------------------------------------------------------
def _replay(env: Any, spec: EnvSpec, seed: int, actions: list[np.ndarray]) -> _Run:
    n = spec.num_envs
    run = _Run(_observations(spec, n, env.reset(seed=seed), "reset(seed)").copy(), [])
    for k, action in enumerate(actions):
        run.steps.append(tuple(array.copy() for array in _check_step(spec, n, env.step(action), f"step {k}")))
    return run


def _step_difference(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> str | None:
    for name, x, y in zip(STEP_FIELDS, a, b):
        if not np.array_equal(x, y):
            return name
    return None


def _difference(a: _Run, b: _Run) -> str | None:
    """Where two runs first differ ("step 3 rewards"), or None."""
    if not np.array_equal(a.reset, b.reset):
        return "the observations reset() returned"
    for k, (x, y) in enumerate(zip(a.steps, b.steps)):
        name = _step_difference(x, y)
        if name is not None:
            return f"step {k} {name}"
    return None


def _copies_differ(run: _Run) -> bool:
    arrays = [run.reset] + [array for step in run.steps for array in step]
    return any(not (array == array[:1]).all() for array in arrays)


def _check_determinism(env: Any, build: Callable[..., Any], spec: EnvSpec, seed: int, actions: list[np.ndarray],
                       run: _Run, report: EnvironmentReport) -> None:
    again = _difference(run, _replay(env, spec, seed, actions))
    assert again is None, (f"{spec.id}: reset(seed={seed}) again with the same actions gave another run (first "
                           f"difference: {again}); the seed must decide the run")
    identical = [np.repeat(action[:1], spec.num_envs, axis=0) for action in actions]
    report.stochastic = _copies_differ(_replay(env, spec, seed, identical))
    if report.stochastic:
        other = _difference(run, _replay(env, spec, seed + 1, actions))
        assert other is not None, (
            f"{spec.id}: reset(seed={seed}) and reset(seed={seed + 1}) gave the same run under the same actions, "
            "though its copies behave randomly: reset ignores its seed")
        report.checked.append("another seed, another run")
    else:
        report.skipped.append("another seed, another run: the copies behaved alike under identical actions "
                              "(a deterministic environment)")
    with _built(lambda: build(construct_seed=seed + 7)) as twin:
        built_with = _difference(run, _replay(twin, spec, seed, actions))
    assert built_with is None, (
        f"{spec.id}: after reset(seed={seed}) the run depends on the seed the environment was built with (first "
        f"difference: {built_with}); reset's seed must decide it")
    report.checked.append("reset(seed) determinism")


# -- gymnasium -----------------------------------------------------------------------------------------
def _check_with_gymnasium(env: Any, report: EnvironmentReport) -> None:
    """gymnasium's check_env on the first gymnasium copy the environment exposes as `env.envs`."""
    gymnasium = sys.modules.get("gymnasium")  # an environment wrapping gymnasium has imported it
    copies = getattr(env, "envs", None)
    if gymnasium is None or not isinstance(copies, (list, tuple)) or not copies or not isinstance(copies[0], gymnasium.Env):
        report.skipped.append("gymnasium's check_env: the environment exposes no gymnasium copies (env.envs)")
        return
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings(record=True) as advice:
        warnings.simplefilter("always")
        try:
            check_env(copies[0].unwrapped, skip_render_check=True)  # rlbench never renders
        except Exception as exc:
            raise AssertionError(f"{env.spec.id}: gymnasium's check_env on its first copy: {type(exc).__name__}: "
                                 f"{exc}") from None
    notes = sorted({str(w.message).strip() for w in advice})
    report.checked.append("gymnasium's check_env on a copy" + (f" ({len(notes)} warning(s))" if notes else ""))
