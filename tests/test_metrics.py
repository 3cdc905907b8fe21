"""The HDR-style histogram: bounded relative error, mergeable, lossless round trip."""

from __future__ import annotations

import numpy as np
import pytest

from rlbench.metrics import SUB_BITS, Histogram, Recorder, bucket_bounds, bucket_index


def test_every_value_lands_in_a_bucket_that_contains_it():
    rng = np.random.default_rng(1)
    values = np.concatenate([np.arange(0, 5000), rng.integers(0, 2**45, 20000), 2 ** np.arange(0, 46)])
    for v in values.tolist():
        lo, hi = bucket_bounds(bucket_index(v))
        assert lo <= v < hi
        assert hi - lo == 1 or (hi - lo) / lo <= 1 / 2 ** (SUB_BITS - 1)  # exact, or within 1/64


@pytest.mark.parametrize("q", [50, 90, 99, 99.9])
def test_percentiles_within_bucket_precision(q):
    values = np.random.default_rng(2).lognormal(mean=9, sigma=1.5, size=50_000).astype(np.int64)
    h = Histogram()
    h.record_many(values)
    exact = np.percentile(values, q, method="inverted_cdf")
    assert abs(h.percentile(q) - exact) <= exact / 2 ** (SUB_BITS - 1) + 1


def test_record_many_equals_record_and_merge_is_additive():
    values = np.random.default_rng(3).integers(0, 10**9, 5000)
    one, many = Histogram(), Histogram()
    for v in values.tolist():
        one.record(v)
    many.record_many(values)
    assert one.counts == many.counts and (one.min, one.max, one.total) == (many.min, many.max, many.total)
    a, b = Histogram(), Histogram()
    a.record_many(values[:2000])
    b.record_many(values[2000:])
    a.merge(b)
    assert a.counts == many.counts and a.count == 5000 and a.min == many.min and a.max == many.max


def test_round_trip_and_summary():
    h = Histogram()
    h.record_many([1000, 2000, 3000, 1_000_000])
    again = Histogram.from_dict(h.to_dict())
    assert again.counts == h.counts and again.summary() == h.summary()
    s = h.summary()
    assert s["unit"] == "us" and s["count"] == 4 and s["max"] == 1000.0 and s["min"] == 1.0
    assert Histogram().summary() == {"count": 0}


def test_recorder_merges_roles():
    a, b = Recorder(), Recorder()
    a.histogram("replay.sample").record(10)
    b.histogram("replay.sample").record(20)
    b.count("lost", 3)
    a.merge(b)
    assert a.histograms["replay.sample"].count == 2 and a.counters == {"lost": 3}
