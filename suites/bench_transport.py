"""Transports: request/echo round-trip latency (p50, p99) and one-way throughput, per message size.

Measured with `rlbench bench transport`'s own code (rlbench.bench.transport): the echo server is a
spawned process for transports that cross processes, a thread otherwise.
"""

from __future__ import annotations

from typing import Any

from .common import lookup, unavailable

from rlbench.bench.matrix import TRANSPORTS

SIZES = ("64", "4096")
SECONDS = 0.25  # per transport, size and mode (round trip, one-way)


class Transport:
    params = [list(TRANSPORTS), list(SIZES)]
    param_names = ["transport", "message_bytes"]
    timeout = 600

    def setup_cache(self) -> dict[str, Any]:
        from rlbench.bench.transport import benchmark_transports

        skipped = unavailable("transport")
        runnable = [name for name in TRANSPORTS if name not in skipped]
        measured = benchmark_transports(runnable, tuple(int(s) for s in SIZES), SECONDS)["transports"]
        from rlbench import get_registry

        reliable = {name: get_registry().get("transport", name).capabilities.reliable for name in runnable}
        cache: dict[str, Any] = {}
        for name in TRANSPORTS:
            for size in SIZES:
                if name in skipped:
                    cache[f"{name}/{size}"] = {"skipped": skipped[name]}
                    continue
                case = next(c for c in measured[name]["cases"] if c["size"] == int(size))
                lost = measured[name]["lost"]
                # Loss is a failure only for a transport that promises none (udp may lose, and counts it).
                cache[f"{name}/{size}"] = {"metrics": case} if not lost or not reliable[name] else \
                    {"failed": f"{name} lost {lost} message(s) while measuring"}
        return cache

    def setup(self, cache: dict[str, Any], transport: str, message_bytes: str) -> None:
        self.case = lookup(cache, f"{transport}/{message_bytes}")

    def track_round_trip_p50(self, cache, transport, message_bytes) -> float:
        return self.case["p50_us"]

    track_round_trip_p50.unit = "us"

    def track_round_trip_p99(self, cache, transport, message_bytes) -> float:
        return self.case["p99_us"]

    track_round_trip_p99.unit = "us"

    def track_one_way_messages_per_s(self, cache, transport, message_bytes) -> float:
        return self.case["msg_per_s"]

    track_one_way_messages_per_s.unit = "messages/s"

    def track_one_way_megabytes_per_s(self, cache, transport, message_bytes) -> float:
        return self.case["mb_per_s"]

    track_one_way_megabytes_per_s.unit = "MB/s"
