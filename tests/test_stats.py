"""The report's statistics against scipy and closed forms: IQM, stratified bootstrap intervals (and
their coverage), probability of improvement, censored times-to-target, curve bands."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from rlbench.report import stats


def test_iqm_is_the_mean_of_the_middle_half():
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert stats.iqm([100, 1, 2, 3]) == pytest.approx(2.5)  # the outlier is trimmed
    sample = np.random.default_rng(3).lognormal(size=37)
    assert stats.iqm(sample) == pytest.approx(scipy_stats.trim_mean(sample, 0.25))


def test_interval_of_one_stratum_is_scipys_percentile_bootstrap():
    sample = np.random.default_rng(7).normal(10.0, 2.0, size=12)
    ours = stats.interval(sample, n_resamples=4000, seed=11)
    theirs = scipy_stats.bootstrap((sample,), lambda s, axis: scipy_stats.trim_mean(s, 0.25, axis=axis),
                                   n_resamples=4000, method="percentile", rng=np.random.default_rng(11))
    assert ours.value == pytest.approx(scipy_stats.trim_mean(sample, 0.25))
    assert ours.low == pytest.approx(theirs.confidence_interval.low)
    assert ours.high == pytest.approx(theirs.confidence_interval.high)
    assert ours.n == 12 and ours.low < ours.value < ours.high


def test_stratified_bootstrap_resamples_within_each_task():
    # Each task is constant, so resampling inside a task changes nothing: a zero-width interval. Pooled
    # (unstratified) resampling would mix the tasks' runs and give a wide one.
    low_task, high_task = [0.0] * 5, [10.0] * 5
    stratified = stats.interval([low_task, high_task], statistic=lambda x, axis=None: np.mean(x, axis=axis))
    assert (stratified.value, stratified.low, stratified.high) == pytest.approx((5.0, 5.0, 5.0))
    pooled = stats.interval(low_task + high_task, statistic=lambda x, axis=None: np.mean(x, axis=axis))
    assert pooled.value == pytest.approx(5.0) and pooled.high - pooled.low > 4.0


@pytest.mark.parametrize("statistic", [stats.iqm, lambda x, axis=None: np.mean(x, axis=axis)], ids=["iqm", "mean"])
def test_95_percent_interval_covers_the_true_mean_in_at_least_90_percent_of_trials(statistic):
    rng = np.random.default_rng(2021)
    true_mean = 3.0  # a symmetric distribution: its IQM is its mean
    covered = sum(stats.interval(rng.normal(true_mean, 1.5, size=30), statistic=statistic, n_resamples=2000,
                                 seed=trial).covers(true_mean) for trial in range(200))
    assert covered >= 180, f"covered the true mean in {covered} of 200 trials"
    assert covered < 200  # an interval that always covers is too wide to mean anything


def test_degenerate_samples():
    assert stats.interval([5.0, 5.0, 5.0]) == stats.Estimate(5.0, 5.0, 5.0, 3)
    one = stats.interval([4.0])
    assert one.value == 4.0 and math.isnan(one.low) and one.n == 1
    assert stats.interval([math.nan, 2.0, 2.0]).n == 2  # not measured is left out
    assert math.isnan(stats.interval([]).value)


def test_never_reached_counts_as_infinite_time():
    partly = stats.interval([1.0, 2.0, 3.0, math.inf])
    assert partly.value == pytest.approx(2.5)  # the IQM trims the missing quarter
    assert math.isinf(partly.high) and partly.low >= 1.0
    mostly = stats.interval([1.0, math.inf, math.inf, math.inf])
    assert math.isinf(mostly.value)


def test_probability_of_improvement_is_mann_whitney_over_pairs():
    better, worse = [3.0, 4.0, 5.0], [1.0, 2.0, 3.0]
    p = stats.probability_of_improvement(better, worse)
    assert p.value == pytest.approx(8.5 / 9)  # 8 wins and one tie (3 vs 3) out of 9 pairs
    assert p.low <= p.value <= p.high <= 1.0
    assert stats.probability_of_improvement(worse, better).value == pytest.approx(0.5 / 9)
    # lower is better (times): the faster set wins, and a run that never reached the target loses
    fast, slow = [1.0, 2.0, 2.5], [3.0, 4.0, math.inf]
    assert stats.probability_of_improvement(fast, slow, higher_is_better=False).value == pytest.approx(1.0)
    separated = stats.probability_of_improvement(np.arange(10.0) + 100, np.arange(10.0))
    assert separated.low > 0.5


def test_separated_intervals():
    a, b, c = stats.Estimate(1, 0, 2, 5), stats.Estimate(5, 3, 6, 5), stats.Estimate(2.5, 1.5, 4, 5)
    assert a.separated_from(b) and b.separated_from(a)
    assert not a.separated_from(c) and not b.separated_from(c)
    assert not a.separated_from(stats.Estimate(9, math.nan, math.nan, 1))


def test_curve_band_brackets_the_iqm_at_every_point():
    runs = np.random.default_rng(5).normal(size=(6, 40)) + np.linspace(0, 10, 40)
    centre, low, high = stats.curve_band(runs)
    assert centre.shape == low.shape == high.shape == (40,)
    assert np.allclose(centre, scipy_stats.trim_mean(runs, 0.25, axis=0))
    assert np.all(low <= centre + 1e-9) and np.all(centre <= high + 1e-9) and np.all(high > low)
    lone_centre, lone_low, _ = stats.curve_band(runs[:1])
    assert np.allclose(lone_centre, runs[0]) and np.isnan(lone_low).all()
