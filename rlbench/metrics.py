"""Measurement primitives: an HDR-style latency histogram and a named set of them.

The histogram is log-linear (HdrHistogram's layout): values below 2**SUB_BITS are exact, above that
each power-of-two range is split into 2**(SUB_BITS-1) equal buckets, so any recorded value is known
to within 1/2**(SUB_BITS-1) (~1.6 % with SUB_BITS=7). Memory is fixed, merging is adding counts,
and recording costs a few integer operations — no list of samples is ever kept.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

SUB_BITS = 7
SUB_COUNT = 1 << SUB_BITS  # 128
HALF = SUB_COUNT >> 1  # 64
MAX_EXPONENT = 40  # values up to ~2**47 ns (~39 hours)
N_BUCKETS = SUB_COUNT + MAX_EXPONENT * HALF


def bucket_index(value: int) -> int:
    if value < SUB_COUNT:
        return value if value > 0 else 0
    shift = value.bit_length() - SUB_BITS
    if shift > MAX_EXPONENT:
        return N_BUCKETS - 1
    return SUB_COUNT + (shift - 1) * HALF + ((value >> shift) - HALF)


def bucket_bounds(index: int) -> tuple[int, int]:
    """Inclusive lower and exclusive upper value of a bucket."""
    if index < SUB_COUNT:
        return index, index + 1
    shift = (index - SUB_COUNT) // HALF + 1
    sub = (index - SUB_COUNT) % HALF + HALF
    return sub << shift, (sub + 1) << shift


class Histogram:
    """Latency histogram in integer nanoseconds (any unit works; the summary says us)."""

    __slots__ = ("counts", "count", "total", "min", "max")

    def __init__(self) -> None:
        self.counts = [0] * N_BUCKETS
        self.count = 0
        self.total = 0
        self.min = 0
        self.max = 0

    def record(self, value_ns: int) -> None:
        # bucket_index, inlined: this runs on every step of every loop
        value_ns = int(value_ns)
        if value_ns < SUB_COUNT:
            if value_ns < 0:
                value_ns = 0
            index = value_ns
        else:
            shift = value_ns.bit_length() - SUB_BITS
            index = N_BUCKETS - 1 if shift > MAX_EXPONENT else SUB_COUNT + (shift - 1) * HALF + ((value_ns >> shift) - HALF)
        self.counts[index] += 1
        if self.count == 0 or value_ns < self.min:
            self.min = value_ns
        if value_ns > self.max:
            self.max = value_ns
        self.count += 1
        self.total += value_ns

    def record_many(self, values_ns: Any) -> None:
        """Record an array of values at once (numpy, vectorised)."""
        import numpy as np

        values = np.asarray(values_ns, dtype=np.int64).ravel()
        if values.size == 0:
            return
        values = np.maximum(values, 0)
        small = values < SUB_COUNT
        indices = np.empty(values.size, dtype=np.int64)
        indices[small] = values[small]
        big = values[~small]
        if big.size:
            # frexp's exponent is the bit length (exact for values below 2**53 ns).
            shift = np.minimum(np.frexp(big.astype(np.float64))[1].astype(np.int64) - SUB_BITS, MAX_EXPONENT)
            indices[~small] = np.minimum(SUB_COUNT + (shift - 1) * HALF + ((big >> shift) - HALF), N_BUCKETS - 1)
        binned = np.bincount(indices, minlength=N_BUCKETS)
        for index in np.flatnonzero(binned):
            self.counts[int(index)] += int(binned[index])
        vmin, vmax = int(values.min()), int(values.max())
        if self.count == 0 or vmin < self.min:
            self.min = vmin
        self.max = max(self.max, vmax)
        self.count += int(values.size)
        self.total += int(values.sum())

    def merge(self, other: "Histogram") -> None:
        if other.count == 0:
            return
        for i, c in enumerate(other.counts):
            if c:
                self.counts[i] += c
        self.min = other.min if self.count == 0 else min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.count += other.count
        self.total += other.total

    def percentile(self, q: float) -> float:
        """Value (ns) at percentile q in [0, 100]: the midpoint of the bucket holding that rank,
        clamped to the observed min/max."""
        if self.count == 0:
            return float("nan")
        rank = max(1, int(round(q / 100.0 * self.count + 0.4999999)))
        seen = 0
        for index, c in enumerate(self.counts):
            if c:
                seen += c
                if seen >= rank:
                    lo, hi = bucket_bounds(index)
                    mid = lo if hi - lo == 1 else (lo + hi - 1) / 2.0
                    return float(min(max(mid, self.min), self.max))
        return float(self.max)

    def summary(self, unit: str = "us", scale: float = 1e-3) -> dict[str, Any]:
        """Percentiles in microseconds (recorded ns * 1e-3), as results and benchmarks print them;
        histograms of counts (queue depths) pass unit="items", scale=1."""
        if self.count == 0:
            return {"count": 0}
        us = scale
        return {
            "count": self.count,
            "unit": unit,
            "mean": self.total / self.count * us,
            "min": self.min * us,
            "p50": self.percentile(50) * us,
            "p90": self.percentile(90) * us,
            "p99": self.percentile(99) * us,
            "max": self.max * us,
        }

    def to_dict(self) -> dict[str, Any]:
        """Lossless, sparse form (for merging histograms from several processes)."""
        return {"sub_bits": SUB_BITS, "count": self.count, "total": self.total, "min": self.min, "max": self.max,
                "buckets": {str(i): c for i, c in enumerate(self.counts) if c}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Histogram":
        if data.get("sub_bits", SUB_BITS) != SUB_BITS:
            raise ValueError("histogram was recorded with a different bucket layout")
        h = cls()
        for i, c in data.get("buckets", {}).items():
            h.counts[int(i)] = int(c)
        h.count, h.total, h.min, h.max = data["count"], data["total"], data["min"], data["max"]
        return h


class Recorder:
    """Named latency histograms and counters of one role. Cheap enough for per-step use."""

    def __init__(self) -> None:
        self.histograms: dict[str, Histogram] = {}
        self.counters: dict[str, int] = {}

    def histogram(self, name: str) -> Histogram:
        h = self.histograms.get(name)
        if h is None:
            h = self.histograms[name] = Histogram()
        return h

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        h = self.histogram(name)
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            h.record(time.perf_counter_ns() - t0)

    def merge(self, other: "Recorder") -> None:
        for name, h in other.histograms.items():
            self.histogram(name).merge(h)
        for name, n in other.counters.items():
            self.count(name, n)

    def latency_summary(self) -> dict[str, Any]:
        return {name: h.summary() for name, h in sorted(self.histograms.items()) if h.count}


# Where a role's time goes (RL-Scope's question): each timed operation belongs to one category. Wall
# time per category says how long each took; the role thread's CPU time says what was work: what the
# thread did outside every category is rlbench's own bookkeeping (the loop, accounting, histograms),
# and wall time off the CPU is waiting (descheduled, or blocked on a peer), never bookkeeping.
TIME_CATEGORIES = ("env", "inference", "learner", "allreduce", "replay", "weights", "checkpoint", "transport",
                   "bookkeeping")
# A per-step category, or a frequent client call, is timed on the thread's CPU clock once every this many;
# prime, so calls that come in a repeating pattern (an INSERT's begin and finish, SAMPLE and
# UPDATE_PRIORITIES) are each sampled in turn, none of them never.
CPU_SAMPLE_EVERY = 17


class CpuMeter:
    """A role thread's CPU time over its loop, and per category. The thread's CPU clock is a syscall
    (~0.8 us here), so a category timed on every env step is sampled: one call in CPU_SAMPLE_EVERY is
    timed and counted that many times (an unbiased estimate); rarer calls are timed each."""

    def __init__(self) -> None:
        self.started_ns = time.thread_time_ns()
        self.categories: dict[str, float] = {}

    def add(self, category: str, ns: float) -> None:
        self.categories[category] = self.categories.get(category, 0.0) + ns

    def add_seconds(self, seconds: dict[str, float]) -> None:
        for category, value in seconds.items():
            self.add(category, value * 1e9)

    def window_s(self) -> float:
        return (time.thread_time_ns() - self.started_ns) / 1e9


def time_split(recorder: Recorder, window_s: float, categories: dict[str, str],
               measured: dict[str, float] | None = None, cpu: CpuMeter | None = None) -> dict[str, float]:
    """Seconds per category over a role's window: `categories` maps a histogram name to its category
    (histograms that overlap others, e.g. a request timed while the caller works, are left out);
    `measured` adds seconds timed otherwise (the time a role spent blocked in its replay client).
    With the role's `cpu` meter: its CPU time (`cpu_s`), the time it was off the CPU (`waiting`), and
    bookkeeping = CPU time outside every category, its share of the CPU time. Without one (a role
    that keeps no meter), bookkeeping is the rest of the window's wall time."""
    split = {category: 0.0 for category in TIME_CATEGORIES}
    for name, category in categories.items():
        histogram = recorder.histograms.get(name)
        if histogram is not None:
            split[category] += histogram.total / 1e9
    for category, seconds in (measured or {}).items():
        split[category] += seconds
    split["window_s"] = window_s
    if cpu is None:
        split["bookkeeping"] = max(0.0, window_s - sum(split[c] for c in TIME_CATEGORIES))
        split["bookkeeping_share"] = split["bookkeeping"] / window_s if window_s > 0 else float("nan")
        return split
    cpu_s = cpu.window_s()
    split["cpu_s"] = cpu_s
    split["waiting"] = max(0.0, window_s - cpu_s)
    split["bookkeeping"] = max(0.0, cpu_s - sum(cpu.categories.values()) / 1e9)
    split["bookkeeping_share"] = split["bookkeeping"] / cpu_s if cpu_s > 0 else float("nan")
    return split


def bookkeeping_share(splits: dict[str, dict[str, float]]) -> float | None:
    """rlbench's own share of the roles' work: their bookkeeping over their CPU time where a role
    measured it, else over its busy time (its window less the time it sat idle)."""
    work = sum(split["cpu_s"] if "cpu_s" in split else split.get("window_s", 0.0) - split.get("idle", 0.0)
               for split in splits.values())
    if work <= 0:
        return None
    return sum(split.get("bookkeeping", 0.0) for split in splits.values()) / work