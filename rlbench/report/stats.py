"""Interval estimates over seeds, the way Agarwal et al. (NeurIPS'21, "Deep RL at the Edge of the
Statistical Precipice", the rliable library) recommend: the interquartile mean (IQM) as the point
estimate, 95 % stratified bootstrap confidence intervals, the probability that one combination
beats another, and the aggregates of normalised scores across tasks (median, IQM, mean, optimality
gap) with the performance profile.

Resampling is scipy's (`scipy.stats.bootstrap`, percentile method): a stratum is one task (an
environment); each stratum is resampled on its own and the statistic is taken over the resample,
pooled (IQM, optimality gap, profile) or per task (median and mean of the task means), as rliable
defines each. With one environment, stratified and plain bootstrap coincide. Estimates are
deterministic (a fixed generator seed), so a report regenerated from the same results shows the
same intervals.

Small samples: with fewer than MIN_RUNS runs in a task the percentile bootstrap's "95 %" interval
is about the runs' min..max and covers far less often than 95 %. Below MIN_RUNS an estimate of one
measure carries the range of the runs instead (kind "range"), an aggregate the range from every
task's worst run to every task's best (`aggregate_range`), and a probability of improvement no
interval (kind "none"); the IQM of fewer than 4 runs trims nothing (it is the mean), which
`trimmed_per_end` says. Below MIN_COMPARE_RUNS a range is no basis for a comparison at all (one run's
range is a point). From MIN_RUNS on the percentile interval still covers less than its nominal 95 %
while the runs are few (`coverage`: about 90 % at 5 runs), which the report says beside it rather
than widening the interval, so that the intervals stay rliable's.

Time to a target is censored: a seed that never reached the target counts as +inf. The IQM
ignores the top quarter, so it stays finite while fewer than a quarter of the seeds missed; an
interval bound beyond the largest finite observation is reported as +inf ("not reached").
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 5000
SEED = 20211206  # NeurIPS'21, the paper's conference date: any fixed seed will do
MIN_RUNS = 5  # per task, for a bootstrap interval; below it: the range of the runs, or no interval
MIN_COMPARE_RUNS = 3  # per task and side, for any comparison: the range of 1 or 2 runs says nothing of the spread

# How often the nominal 95 % percentile bootstrap interval of the IQM covered the true value, by runs
# per task: 1,500 to 4,500 simulated samples of each size from a normal distribution, 2,000 resamples
# each (n=5: 90.4 %, 6: 90.7, 7: 92.2, 8: 93.2, 10: 94.0, 15: 93.9, 20: 94.8; tests/test_stats.py
# rechecks n=5). Skewed or heavy-tailed returns cover less. From 20 runs on it is about its nominal 95 %.
PERCENTILE_COVERAGE = {5: 0.90, 6: 0.91, 7: 0.92, 8: 0.93, **{n: 0.94 for n in range(9, 20)}}


@dataclass(frozen=True)
class Estimate:
    """A point estimate over `n` runs with its interval: a 95 % stratified bootstrap interval
    (kind "ci"), the runs' min..max (kind "range": fewer than MIN_RUNS in some task), or none
    (kind "none": low/high NaN)."""

    value: float
    low: float
    high: float
    n: int
    kind: str = "ci"
    smallest: int = field(default=-1, compare=False)  # the fewest runs in one task (-1: n, one task)

    @property
    def per_task(self) -> int:
        """The runs of the task with the fewest: what a small-sample rule looks at."""
        return self.n if self.smallest < 0 else self.smallest

    def separated_from(self, other: "Estimate") -> bool:
        """True when the two intervals (or ranges) do not overlap; False when either has none."""
        if any(math.isnan(v) for v in (self.low, self.high, other.low, other.high)):
            return False
        return self.low > other.high or other.low > self.high

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low


def coverage(n: int) -> float | None:
    """The simulated coverage of the nominal 95 % percentile bootstrap interval at `n` runs per task,
    where it falls short of 95 % by a point or more; None from 20 runs on and below MIN_RUNS (no interval)."""
    return PERCENTILE_COVERAGE.get(int(n))


def coverage_words(n: int) -> str:
    """What a "95 %" interval over `n` runs per task is worth, for a note beside it; "" when it is about 95 %."""
    covered = coverage(n)
    if covered is None:
        return ""
    percent = f"{covered * 100:.0f} %"
    return (f"at {n} runs per environment a 95 % percentile bootstrap interval covers the true value about "
            f"{percent} of the time (simulated, normal returns; less for skewed ones): read it as a {percent} interval")


def trimmed_per_end(n: int) -> int:
    """Runs the IQM of `n` runs drops at each end (scipy's trim_mean: floor(n / 4))."""
    return int(0.25 * n)


def iqm(values: Sequence[float] | np.ndarray, axis: int | None = None) -> float | np.ndarray:
    """Interquartile mean: the mean of the middle 50 % (scipy's 25 %-trimmed mean)."""
    from scipy.stats import trim_mean

    return trim_mean(np.asarray(values, dtype=np.float64), 0.25, axis=axis)


# Aggregates over tasks of normalised scores, as rliable defines them; each takes one array per task
# (the runs on the last axis).
def aggregate_iqm(*tasks: np.ndarray, axis: int = -1) -> np.ndarray:
    """IQM of every run of every task, pooled."""
    return iqm(np.concatenate(tasks, axis=axis), axis=axis)


def aggregate_mean(*tasks: np.ndarray, axis: int = -1) -> np.ndarray:
    """Mean over tasks of each task's mean score."""
    return np.mean(np.stack([np.mean(t, axis=axis) for t in tasks], axis=-1), axis=-1)


def aggregate_median(*tasks: np.ndarray, axis: int = -1) -> np.ndarray:
    """Median over tasks of each task's mean score."""
    return np.median(np.stack([np.mean(t, axis=axis) for t in tasks], axis=-1), axis=-1)


def optimality_gap(*tasks: np.ndarray, axis: int = -1, gamma: float = 1.0) -> np.ndarray:
    """How far runs fall short of the reference score (gamma), scores above it counting as gamma:
    gamma - mean(min(score, gamma)) over every run of every task; lower is better."""
    pooled = np.concatenate(tasks, axis=axis)
    return gamma - np.mean(np.minimum(pooled, gamma), axis=axis)


AGGREGATES = {"median": aggregate_median, "IQM": aggregate_iqm, "mean": aggregate_mean,
              "optimality gap": optimality_gap}  # name -> statistic; the gap alone is lower-is-better


def _censor(strata: list[np.ndarray]) -> tuple[list[np.ndarray], float]:
    """+inf (never reached) as a finite stand-in above every observation, so resampling and
    percentiles stay finite; returns the largest finite value to map bounds back."""
    finite = np.concatenate([s[np.isfinite(s)] for s in strata]) if strata else np.empty(0)
    top = float(finite.max()) if finite.size else 0.0
    stand_in = abs(top) * 1e6 + 1e12
    return [np.where(np.isposinf(s), stand_in, s) for s in strata], top


def _order_preserving_finite(samples: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """The same ordering with +-inf replaced by values just beyond the finite ones."""
    both = np.concatenate(samples)
    finite = both[np.isfinite(both)]
    high = float(finite.max()) + 1.0 if finite.size else 1.0
    low = float(finite.min()) - 1.0 if finite.size else -1.0
    return tuple(np.where(np.isposinf(v), high, np.where(np.isneginf(v), low, v)) for v in samples)


def _strata(strata: Sequence[Sequence[float]] | Sequence[float]) -> list[np.ndarray]:
    """One float array per task, NaN (not measured) left out, empty tasks dropped; a flat list is one task."""
    groups = list(strata)
    if not groups or not isinstance(groups[0], (list, tuple, np.ndarray)):
        groups = [groups]
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    arrays = [a[~np.isnan(a)] for a in arrays]
    return [a for a in arrays if a.size]


def _bootstrap(samples: tuple[np.ndarray, ...], statistic: Callable, *, confidence: float, n_resamples: int,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
    from scipy.stats import bootstrap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # identical values: a zero-width interval is the answer
        result = bootstrap(samples, statistic, n_resamples=n_resamples, confidence_level=confidence, axis=-1,
                           method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return np.asarray(result.confidence_interval.low), np.asarray(result.confidence_interval.high)


def interval(strata: Sequence[Sequence[float]] | Sequence[float], statistic: Callable = iqm, *,
             per_task: bool = False, confidence: float = CONFIDENCE, n_resamples: int = RESAMPLES,
             seed: int = SEED) -> Estimate:
    """`statistic` over the runs with its stratified bootstrap interval. `strata` is one list of
    values per task (or a flat list: one task). `statistic(values, axis)` sees the runs of every
    task pooled; with `per_task`, `statistic(*tasks, axis)` sees them task by task (rliable's
    median and mean). Below MIN_RUNS runs in some task: the range of the runs (pooled statistics) or
    no interval (per-task ones)."""
    arrays = _strata(strata)
    n = sum(a.size for a in arrays)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "none")
    smallest = min(a.size for a in arrays)
    censored = any(np.isposinf(a).any() for a in arrays)
    finite = [a.copy() for a in arrays]
    if censored:
        finite, top = _censor(arrays)

    def over_tasks(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        if per_task:
            return statistic(*samples, axis=axis)
        return statistic(np.concatenate(samples, axis=axis), axis=axis)

    value = float(over_tasks(*finite))
    if min(a.size for a in arrays) < MIN_RUNS:
        if per_task:
            low, high, kind = math.nan, math.nan, "none"
        else:
            pooled = np.concatenate(arrays)
            low, high, kind = float(pooled.min()), float(pooled.max()), "range"
    else:
        lows, highs = _bootstrap(tuple(finite), over_tasks, confidence=confidence, n_resamples=n_resamples, seed=seed)
        low, high, kind = float(lows), float(highs), "ci"
    if censored:
        value, low, high = (math.inf if v > top else v for v in (value, low, high))
    return Estimate(value, low, high, n, kind, smallest)


def aggregate_range(strata: Sequence[Sequence[float]], statistic: Callable) -> Estimate:
    """An aggregate over tasks below MIN_RUNS runs, where it has no interval: its value, and the range
    from the aggregate of every task's worst run to that of every task's best (each aggregate is
    monotone in every run, so the value lies between them; the optimality gap's order is reversed)."""
    arrays = _strata(strata)
    if not arrays:
        return Estimate(math.nan, math.nan, math.nan, 0, "none")
    value = float(statistic(*arrays, axis=-1))
    # every run of a task replaced by the task's worst (best) run: a lower (upper) bound of a monotone statistic
    worst = float(statistic(*[np.full(a.size, a.min()) for a in arrays], axis=-1))
    best = float(statistic(*[np.full(a.size, a.max()) for a in arrays], axis=-1))
    return Estimate(value, min(worst, best), max(worst, best), sum(a.size for a in arrays), "range",
                    min(a.size for a in arrays))


def probability_of_improvement(x: Sequence[Sequence[float]] | Sequence[float],
                               y: Sequence[Sequence[float]] | Sequence[float], *, higher_is_better: bool = True,
                               confidence: float = CONFIDENCE, n_resamples: int = RESAMPLES,
                               seed: int = SEED) -> Estimate:
    """P(a run of X beats a run of Y on the same task), ties counting half, averaged over tasks
    (rliable's definition; per task it is the Mann-Whitney U over n*m). `x` and `y` hold one list
    per task, in the same task order (or flat lists: one task). The interval resamples X's and Y's
    runs within each task independently; none below MIN_RUNS runs in some task."""
    xs, ys = list(x), list(y)
    if not xs or not isinstance(xs[0], (list, tuple, np.ndarray)):
        xs, ys = [xs], [ys]
    if len(xs) != len(ys):
        raise ValueError(f"X has {len(xs)} task(s), Y {len(ys)}: the probability of improvement compares the same tasks")
    pairs = []
    for a, b in zip(xs, ys):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        a, b = a[~np.isnan(a)], b[~np.isnan(b)]
        if a.size and b.size:
            pairs.append((a, b) if higher_is_better else (-a, -b))
    if not pairs:
        return Estimate(math.nan, math.nan, math.nan, 0, "none")
    tasks = len(pairs)

    def prob(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        per_task = []
        for a, b in zip(samples[:tasks], samples[tasks:]):
            a, b = np.moveaxis(a, axis, -1)[..., :, None], np.moveaxis(b, axis, -1)[..., None, :]
            per_task.append(np.mean(a > b, axis=(-2, -1)) + 0.5 * np.mean(a == b, axis=(-2, -1)))
        return np.mean(np.stack(per_task, axis=-1), axis=-1)

    samples = tuple(a for a, _ in pairs) + tuple(b for _, b in pairs)
    value = float(prob(*samples))
    n = sum(s.size for s in samples)
    smallest = min(s.size for s in samples)
    if smallest < MIN_RUNS:
        return Estimate(value, math.nan, math.nan, n, "none", smallest)
    # +-inf (never reached) compares as it should, but resampling wants finite numbers: the same order
    low, high = _bootstrap(_order_preserving_finite(samples), prob, confidence=confidence, n_resamples=n_resamples,
                           seed=seed)
    return Estimate(value, float(low), float(high), n, "ci", smallest)


def performance_profile(strata: Sequence[Sequence[float]] | Sequence[float], taus: np.ndarray, *,
                        confidence: float = CONFIDENCE, n_resamples: int = 2000,
                        seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fraction of runs (every task pooled) whose score exceeds each tau, with its stratified
    bootstrap band (rliable's run-score distribution); NaN bands below MIN_RUNS runs in some task."""
    arrays = _strata(strata)
    taus = np.asarray(taus, dtype=np.float64)
    # one indicator row per tau, the runs along the last axis: scipy resamples the runs once for every tau
    indicators = tuple((a[None, :] > taus[:, None]).astype(np.float64) for a in arrays)
    centre = np.mean(np.concatenate(indicators, axis=-1), axis=-1)
    if not arrays or min(a.size for a in arrays) < MIN_RUNS:
        nan = np.full_like(centre, np.nan)
        return centre, nan, nan

    def fraction(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean(np.concatenate(samples, axis=axis), axis=axis)

    low, high = _bootstrap(indicators, fraction, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return centre, low, high


def curve_band(values: np.ndarray, *, confidence: float = CONFIDENCE, n_resamples: int = 2000,
               seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """IQM across runs (axis 0) at every point of a curve, with its band: the bootstrap interval
    ("ci"), or with fewer than MIN_RUNS runs the runs' min..max ("range")."""
    data = np.asarray(values, dtype=np.float64)
    centre = np.asarray(iqm(data, axis=0), dtype=np.float64)
    if data.shape[0] < MIN_RUNS:
        return centre, data.min(axis=0), data.max(axis=0), "range"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from scipy.stats import bootstrap

        result = bootstrap((data,), lambda s, axis=-1: iqm(s, axis=axis), axis=0, n_resamples=n_resamples,
                           confidence_level=confidence, method="percentile", vectorized=True,
                           rng=np.random.default_rng(seed))
    return centre, np.asarray(result.confidence_interval.low), np.asarray(result.confidence_interval.high), "ci"
