"""Interval estimates over seeds, the way Agarwal et al. (NeurIPS'21, "Deep RL at the Edge of the
Statistical Precipice") recommend: the interquartile mean (IQM) as the point estimate, 95 %
stratified bootstrap confidence intervals, and the probability that one combination beats another.

Resampling is scipy's (`scipy.stats.bootstrap`, percentile method): a stratum is one task (an
environment); each stratum is resampled on its own and the statistic is taken over the pooled
resample, which is what scipy does with several unpaired samples. With one environment, stratified
and plain bootstrap coincide. Estimates are deterministic (a fixed generator seed), so a report
regenerated from the same results shows the same intervals.

Time to a target return is censored: a seed that never reached the target counts as +inf. The IQM
ignores the top quarter, so it stays finite while fewer than a quarter of the seeds missed; an
interval bound beyond the largest finite observation is reported as +inf ("not reached").
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 5000
SEED = 20211206  # NeurIPS'21, the paper's conference date: any fixed seed will do


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval over `n` runs (low/high NaN when n < 2)."""

    value: float
    low: float
    high: float
    n: int

    def separated_from(self, other: "Estimate") -> bool:
        """True when the two intervals do not overlap (both must exist)."""
        if any(math.isnan(v) for v in (self.low, self.high, other.low, other.high)):
            return False
        return self.low > other.high or other.low > self.high

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high


def iqm(values: Sequence[float] | np.ndarray, axis: int | None = None) -> float | np.ndarray:
    """Interquartile mean: the mean of the middle 50 % (scipy's 25 %-trimmed mean)."""
    from scipy.stats import trim_mean

    return trim_mean(np.asarray(values, dtype=np.float64), 0.25, axis=axis)


def _censor(strata: list[np.ndarray]) -> tuple[list[np.ndarray], float]:
    """+inf (never reached) as a finite stand-in above every observation, so resampling and
    percentiles stay finite; returns the largest finite value to map bounds back."""
    finite = np.concatenate([s[np.isfinite(s)] for s in strata]) if strata else np.empty(0)
    top = float(finite.max()) if finite.size else 0.0
    stand_in = abs(top) * 1e6 + 1e12
    return [np.where(np.isposinf(s), stand_in, s) for s in strata], top


def _order_preserving_finite(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same ordering with +-inf replaced by values just beyond the finite ones."""
    both = np.concatenate([a, b])
    finite = both[np.isfinite(both)]
    high = float(finite.max()) + 1.0 if finite.size else 1.0
    low = float(finite.min()) - 1.0 if finite.size else -1.0
    return tuple(np.where(np.isposinf(v), high, np.where(np.isneginf(v), low, v)) for v in (a, b))


def interval(strata: Sequence[Sequence[float]] | Sequence[float], statistic: Callable = iqm, *,
             confidence: float = CONFIDENCE, n_resamples: int = RESAMPLES, seed: int = SEED) -> Estimate:
    """`statistic` of the pooled runs with its stratified bootstrap interval. `strata` is one list of
    values per task (or a flat list: one task). NaN values (not measured) are left out."""
    from scipy.stats import bootstrap

    groups = list(strata)
    if not groups or not isinstance(groups[0], (list, tuple, np.ndarray)):
        groups = [groups]
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    arrays = [a[~np.isnan(a)] for a in arrays]
    arrays = [a for a in arrays if a.size]
    n = sum(a.size for a in arrays)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    censored = any(np.isposinf(a).any() for a in arrays)
    if censored:
        arrays, top = _censor(arrays)

    def pooled(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        return statistic(np.concatenate(samples, axis=axis), axis=axis)

    value = float(pooled(*arrays))
    low = high = math.nan
    if n >= 2:
        if min(a.size for a in arrays) < 2:  # scipy resamples samples of two or more: pool a lone run's task
            arrays = [np.concatenate(arrays)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # identical values: a zero-width interval is the answer
            result = bootstrap(tuple(arrays), pooled, n_resamples=n_resamples, confidence_level=confidence,
                               method="percentile", vectorized=True, rng=np.random.default_rng(seed))
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if censored:
        value, low, high = (math.inf if v > top else v for v in (value, low, high))
    return Estimate(value, low, high, n)


def probability_of_improvement(x: Sequence[float], y: Sequence[float], *, higher_is_better: bool = True,
                               confidence: float = CONFIDENCE, n_resamples: int = RESAMPLES,
                               seed: int = SEED) -> Estimate:
    """P(a run of X beats a run of Y), ties counting half: the Mann-Whitney U statistic over n*m,
    with a bootstrap interval resampling X and Y independently."""
    from scipy.stats import bootstrap, mannwhitneyu

    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if not higher_is_better:
        a, b = -a, -b
    if a.size == 0 or b.size == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    a, b = _order_preserving_finite(a, b)  # U depends only on order; inf (never reached) ranks last

    def prob(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return mannwhitneyu(p, q, axis=axis, method="asymptotic").statistic / (p.shape[axis] * q.shape[axis])

    value = float(prob(a, b))
    low = high = math.nan
    if a.size >= 2 and b.size >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = bootstrap((a, b), prob, n_resamples=n_resamples, confidence_level=confidence,
                               method="percentile", vectorized=True, rng=np.random.default_rng(seed))
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return Estimate(value, low, high, a.size + b.size)


def curve_band(values: np.ndarray, *, confidence: float = CONFIDENCE, n_resamples: int = 2000,
               seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQM across runs (axis 0) at every point of a curve, with its bootstrap band (NaN with one run)."""
    from scipy.stats import bootstrap

    data = np.asarray(values, dtype=np.float64)
    centre = np.asarray(iqm(data, axis=0), dtype=np.float64)
    if data.shape[0] < 2:
        nan = np.full_like(centre, np.nan)
        return centre, nan, nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = bootstrap((data,), lambda s, axis=-1: iqm(s, axis=axis), axis=0, n_resamples=n_resamples,
                           confidence_level=confidence, method="percentile", vectorized=True,
                           rng=np.random.default_rng(seed))
    return centre, np.asarray(result.confidence_interval.low), np.asarray(result.confidence_interval.high)
