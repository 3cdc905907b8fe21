"""`rlbench bench transport`: round-trip latency and one-way throughput of every transport, side by
side in one run, each p50 shown as a ratio to the kernel udp transport's.

The echo server runs in a spawned process for transports that cross processes (a thread for the
rest) and is built from the registry by name, so plugin transports are measured the same way.
Only click is imported at module level (the CLI imports this module to list its commands).
"""

from __future__ import annotations

import json as json_module
import time
from typing import Any

import click

from rlbench.kit.bench import parse_sizes

DEFAULT_SIZES = (64, 4096)
_WARMUP = 300
ECHO, _SINK, _FINISH, QUIT = b"e", b"s", b"f", b"q"  # the first byte of each message to the echo server


def serve_echo(name: str, options: dict[str, Any], addresses: Any) -> None:
    """Echo server: echoes e-messages, counts s-messages, answers f with the count, stops on q."""
    from rlbench.plugins import get_registry

    listener = get_registry().get("transport", name).create(**options).listen(None)
    addresses.put(listener.address)
    sunk = 0
    try:
        while True:
            item = listener.recv(timeout=60.0)
            if item is None:
                return
            peer, message = item
            op = message[:1]
            if op == ECHO:
                listener.send(peer, message)
            elif op == _SINK:
                sunk += 1
            elif op == _FINISH:
                listener.send(peer, sunk.to_bytes(8, "little"))
                sunk = 0
            elif op == QUIT:
                return
    finally:
        listener.close()


def _start_server(name: str, crosses_processes: bool) -> tuple[Any, str]:
    if crosses_processes:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        addresses = context.Queue()
        server: Any = context.Process(target=serve_echo, args=(name, {}, addresses), daemon=True)
    else:
        import queue
        import threading

        addresses = queue.Queue()
        server = threading.Thread(target=serve_echo, args=(name, {}, addresses), daemon=True)
    server.start()
    return server, addresses.get(timeout=60)


def _ask_again_on_loss(connection: Any, message: bytes, *, timeout: float = 3.0, attempts: int = 10) -> memoryview:
    """An idempotent request over a transport that may lose messages: right after a one-way burst a
    udp receive buffer can be full, and the request or its reply dropped; ask again."""
    for attempt in range(attempts):
        try:
            return connection.request(message, timeout=timeout)
        except TimeoutError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _measure(connection: Any, size: int, seconds: float) -> dict[str, Any]:
    import numpy as np

    from rlbench.metrics import Histogram

    echo = ECHO + bytes(max(0, size - 1))
    for _ in range(_WARMUP):
        connection.request(echo, timeout=10.0)
    samples = []
    clock = time.perf_counter_ns
    end = clock() + int(seconds * 1e9)
    while True:
        started = clock()
        connection.request(echo, timeout=10.0)
        finished = clock()
        samples.append(finished - started)
        if finished >= end:
            break
    latency = Histogram()
    latency.record_many(np.asarray(samples, dtype=np.int64))

    sink = _SINK + bytes(max(0, size - 1))
    sent = 0
    started = time.perf_counter()
    end_s = started + seconds
    while time.perf_counter() < end_s:
        for _ in range(64):
            connection.send(sink)
        sent += 64
    received = int.from_bytes(bytes(_ask_again_on_loss(connection, _FINISH)), "little")
    elapsed = time.perf_counter() - started
    summary = latency.summary()
    return {"size": size, "round_trips": latency.count, "p50_us": summary["p50"], "p99_us": summary["p99"],
            "oneway_sent": sent, "oneway_received": received, "msg_per_s": received / elapsed,
            "mb_per_s": received * size / elapsed / 1e6}


def benchmark_transports(names: list[str] | None = None, sizes: tuple[int, ...] = DEFAULT_SIZES,
                         seconds: float = 1.0) -> dict[str, Any]:
    """Measure each transport at each size; unavailable ones are reported with their probe reason."""
    import platform

    from rlbench.plugins import get_registry

    registry = get_registry()
    names = names or registry.names("transport")
    components = [registry.get("transport", name) for name in names]  # unknown names: "did you mean"
    results: dict[str, Any] = {"sizes": list(sizes), "seconds_per_case": seconds, "machine": platform.node(),
                               "transports": {}}
    for component in components:
        probe = component.probe()
        if not probe.available:
            results["transports"][component.name] = {"available": False, "reason": probe.reason}
            continue
        server, address = _start_server(component.name, component.capabilities.crosses_processes)
        connection = component.create().connect(address, timeout=30.0)
        try:
            cases = [_measure(connection, size, seconds) for size in sizes]
            stats = dict(connection.stats)
        finally:
            connection.send(QUIT)
            connection.close()
            server.join(10)
        results["transports"][component.name] = {
            "available": True, "plugin": component.plugin,
            "echo_server": "spawned process" if component.capabilities.crosses_processes else "thread",
            "cases": cases, "lost": stats.get("lost", 0)}
    _add_udp_ratios(results)
    return results


def _add_udp_ratios(results: dict[str, Any]) -> None:
    udp = results["transports"].get("udp", {})
    baseline = {case["size"]: case["p50_us"] for case in udp.get("cases", [])}
    for entry in results["transports"].values():
        for case in entry.get("cases", []):
            base = baseline.get(case["size"])
            case["p50_vs_udp"] = case["p50_us"] / base if base else None


def format_table(results: dict[str, Any]) -> str:
    header = f"{'transport':<12}{'size B':>8}{'p50 us':>10}{'p99 us':>10}{'p50/udp':>9}{'msg/s':>12}{'MB/s':>10}"
    lines = [header, "-" * len(header)]
    unavailable = []
    for name, entry in results["transports"].items():
        if not entry["available"]:
            unavailable.append(f"  {name}: unavailable: {entry['reason']}")
            continue
        for case in entry["cases"]:
            ratio = "n/a" if case["p50_vs_udp"] is None else f"{case['p50_vs_udp']:.2f}"
            lines.append(f"{name:<12}{case['size']:>8}{case['p50_us']:>10.2f}{case['p99_us']:>10.2f}{ratio:>9}"
                         f"{case['msg_per_s']:>12,.0f}{case['mb_per_s']:>10.1f}")
    lines.append(f"round trip = request/echo ({results['seconds_per_case']} s per case); one-way = msgs the "
                 "server counted / time until it confirmed")
    return "\n".join(lines + unavailable)


@click.command("transport")
@click.option("--transport", "names", multiple=True, metavar="NAME",
              help="transport to measure (repeatable); default: every registered transport")
@click.option("--sizes", default="64,4096", show_default=True, callback=parse_sizes,
              help="message sizes in bytes, comma-separated")
@click.option("--seconds", default=1.0, show_default=True, type=click.FloatRange(min=0.05),
              help="measuring time per transport, size and mode")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
def command(names: tuple[str, ...], sizes: tuple[int, ...], seconds: float, as_json: bool) -> None:
    """Round-trip latency (p50/p99) and one-way throughput of transports, side by side, vs udp."""
    from rlbench.errors import RlbenchError

    try:
        results = benchmark_transports(list(names) or None, sizes, seconds)
    except RlbenchError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(json_module.dumps(results, indent=2) if as_json else format_table(results))
