"""`rlbench bench transport`: round-trip latency and one-way throughput of every transport, side by
side in one run, each p50 shown as a ratio to the kernel udp transport's.

Image payloads (`image=True`, the command's default): per transport, the bytes/s of image SAMPLE
replies (a request answered with the BATCH an Atari run's learner gets: IMAGE_BATCH_ROWS stacked
4x84x84 uint8 transitions, ~1.8 MB, encoded once by the server and decoded by the client with the
wire's codec) beside the transport's raw bandwidth for messages of that size (a one-way stream of
them, nothing of rlbench's in it), measured in the same run.

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
IMAGE_BATCH_ROWS = 32  # an Atari learner's batch (CleanRL's dqn_atari.py)
_WARMUP = 300
_IMAGE_WARMUP = 5
# the first byte of each message to the echo server
ECHO, _SINK, _FINISH, _SAMPLE, QUIT = b"e", b"s", b"f", b"b", b"q"


def image_batch(rows: int = IMAGE_BATCH_ROWS) -> list[Any]:
    """The parts of a BATCH message of `rows` stacked Atari transitions (rlbench.kit.bench.image_transitions)."""
    import numpy as np

    from rlbench.kit.bench import image_transitions
    from rlbench.runtime.distributed import messages

    batch = {**image_transitions(rows, seed=0), "indices": np.arange(rows, dtype=np.int64),
             "weights": np.ones(rows, np.float32), "step": np.int64(0)}
    return messages.encode(messages.Op.BATCH, batch)


def serve_echo(name: str, options: dict[str, Any], addresses: Any) -> None:
    """Echo server: echoes e-messages, counts s-messages, answers f with the count, b with an image
    BATCH (`image_batch`), stops on q."""
    from rlbench.kit.framing import reuse_freed_memory
    from rlbench.plugins import get_registry

    reuse_freed_memory()  # as a replay node does: the same allocator on both sides of a comparison
    listener = get_registry().get("transport", name).create(**options).listen(None)
    addresses.put(listener.address)
    sunk = 0
    batch = None
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
            elif op == _SAMPLE:
                batch = batch or image_batch()  # encoded once, as a node's weights are: the wire is measured
                listener.send(peer, *batch)
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


def _stream(connection: Any, size: int, seconds: float) -> tuple[int, int, float]:
    """One way: `size`-byte messages sent for `seconds` as fast as the transport takes them (in
    bursts of at most ~64 messages or 16 MB); (sent, what the server counted, seconds until it said so)."""
    sink = _SINK + bytes(max(0, size - 1))
    burst = max(1, min(64, (16 << 20) // max(1, size)))
    sent = 0
    started = time.perf_counter()
    end_s = started + seconds
    while time.perf_counter() < end_s:
        for _ in range(burst):
            connection.send(sink)
        sent += burst
    received = int.from_bytes(bytes(_ask_again_on_loss(connection, _FINISH)), "little")
    return sent, received, time.perf_counter() - started


def stream_rate(connection: Any, size: int, seconds: float) -> float:
    """Bytes/s of a one-way stream of `size`-byte messages to an echo server (serve_echo): the
    transport's raw bandwidth for messages of that size."""
    _, received, elapsed = _stream(connection, size, seconds)
    return received * size / elapsed


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

    sent, received, elapsed = _stream(connection, size, seconds)
    summary = latency.summary()
    return {"size": size, "round_trips": latency.count, "p50_us": summary["p50"], "p99_us": summary["p99"],
            "oneway_sent": sent, "oneway_received": received, "msg_per_s": received / elapsed,
            "mb_per_s": received * size / elapsed / 1e6}


def _measure_image(connection: Any, seconds: float) -> dict[str, Any]:
    """Image SAMPLE replies (requested, received and decoded) for `seconds`, then a one-way stream of
    messages of their size for as long: bytes/s of each."""
    import numpy as np

    from rlbench.runtime.distributed import messages

    reply_bytes = sum(memoryview(part).nbytes for part in image_batch())
    for _ in range(_IMAGE_WARMUP):
        connection.request(_SAMPLE, timeout=30.0)
    samples = []
    clock = time.perf_counter_ns
    started = clock()
    end = started + int(seconds * 1e9)
    while True:
        began = clock()
        op, _, arrays = messages.decode(connection.request(_SAMPLE, timeout=30.0))
        finished = clock()
        if op != messages.Op.BATCH or len(arrays["indices"]) != IMAGE_BATCH_ROWS:
            raise AssertionError(f"the echo server answered {op.name}, not a BATCH of {IMAGE_BATCH_ROWS}")
        samples.append(finished - began)
        if finished >= end:
            break
    elapsed = (clock() - started) / 1e9
    replies = len(samples) * reply_bytes / elapsed
    stream = stream_rate(connection, reply_bytes, seconds)
    return {"reply_bytes": reply_bytes, "replies": len(samples),
            "reply_p50_ms": float(np.percentile(samples, 50)) / 1e6,
            "replies_mb_per_s": replies / 1e6, "stream_mb_per_s": stream / 1e6, "stream_vs_replies": stream / replies}


def benchmark_transports(names: list[str] | None = None, sizes: tuple[int, ...] = DEFAULT_SIZES,
                         seconds: float = 1.0, *, image: bool = False) -> dict[str, Any]:
    """Measure each transport at each size (and, with `image`, its image SAMPLE replies beside a
    stream of messages of their size); unavailable ones are reported with their probe reason."""
    import platform

    from rlbench.kit.framing import reuse_freed_memory
    from rlbench.plugins import get_registry

    reuse_freed_memory()  # as a replay client does
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
            image_case = _measure_image(connection, seconds) if image else None
            stats = dict(connection.stats)
        finally:
            connection.send(QUIT)
            connection.close()
            server.join(10)
        results["transports"][component.name] = {
            "available": True, "plugin": component.plugin,
            "echo_server": "spawned process" if component.capabilities.crosses_processes else "thread",
            "cases": cases, "lost": stats.get("lost", 0), **({"image": image_case} if image else {})}
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
    images = {name: entry["image"] for name, entry in results["transports"].items() if entry.get("image")}
    if images:
        reply_bytes = next(iter(images.values()))["reply_bytes"]
        header = f"{'transport':<12}{'reply p50 ms':>13}{'replies MB/s':>14}{'stream MB/s':>13}{'stream/replies':>16}"
        lines += ["", f"image SAMPLE replies: a BATCH of {IMAGE_BATCH_ROWS} stacked 4x84x84 uint8 transitions "
                      f"({reply_bytes:,} B) per request, decoded by the client, beside a one-way stream of messages "
                      "of that size (the transport's raw bandwidth), in this run", header, "-" * len(header)]
        for name, case in images.items():
            lines.append(f"{name:<12}{case['reply_p50_ms']:>13.2f}{case['replies_mb_per_s']:>14,.0f}"
                         f"{case['stream_mb_per_s']:>13,.0f}{case['stream_vs_replies']:>15.2f}x")
    return "\n".join(lines + unavailable)


@click.command("transport")
@click.option("--transport", "names", multiple=True, metavar="NAME",
              help="transport to measure (repeatable); default: every registered transport")
@click.option("--sizes", default="64,4096", show_default=True, callback=parse_sizes,
              help="message sizes in bytes, comma-separated")
@click.option("--seconds", default=1.0, show_default=True, type=click.FloatRange(min=0.05),
              help="measuring time per transport, size and mode")
@click.option("--image/--no-image", default=True, show_default=True,
              help="also image SAMPLE replies (~1.8 MB) beside a stream of messages of that size")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
def command(names: tuple[str, ...], sizes: tuple[int, ...], seconds: float, image: bool, as_json: bool) -> None:
    """Round-trip latency (p50/p99) and one-way throughput of transports, side by side, vs udp; and
    the bytes/s of image SAMPLE replies beside the transport's raw bandwidth for their size."""
    from rlbench.errors import RlbenchError

    try:
        results = benchmark_transports(list(names) or None, sizes, seconds, image=image)
    except RlbenchError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(json_module.dumps(results, indent=2) if as_json else format_table(results))
