"""`rlbench bench access`: replay access as the roles see it, and where its time goes.

For each transport, in one run: the runtime's real replay node (rlbench.kit.access, its own
process) serving the core memory through its native fast path, then the same node serving through
its general (Python) path, and an echo server over the same transport (the wire with nothing of
rlbench's on either side). Blocks of INSERT (one CartPole transition) and SAMPLE requests to the
node alternate with blocks of echoes of the same sizes; then INSERT throughput (32 transitions per
INSERT, one actor) on that node. Every figure is measured; the shares split each p50 into the wire,
the node's own handling, the memory operation and the client's remainder (rlbench.kit.access.time_shares).

Image payloads (`--image`, the default): a node whose memory stores each frame once (frames=4, as an
Atari run's replay node) is filled with an Atari actor's INSERTs (IMAGE_INSERT_ROWS stacked 4x84x84
uint8 transitions each, framed: each frame once), then SAMPLEs of `--batch-size` transitions (32:
1.8 MB stacked, 1.1 MB as the node sends them, each row's 5 frames once) alternate with blocks of a
one-way stream of messages of the reply's size over the same transport: the bytes/s of image SAMPLE
replies beside the transport's raw bandwidth for messages of that size (and the same for the INSERTs).
Only click is imported at module level (the CLI imports this module to list its commands).
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any, Callable

import click

DEFAULT_TRANSPORTS = ("shm", "udp", "dpdk")
WIRE_FLOOR_BYTES = 64
BLOCKS = 10
WARM_UP = 20  # requests at the start of each block left out (a server that slept wakes up)
THROUGHPUT_ROWS = 32
IMAGE_INSERT_ROWS = 128  # an actor's chunk (rlbench.runtime.distributed.roles.ACTOR_INSERT_TRANSITIONS)
IMAGE_STORED = 2048  # transitions the node holds before image SAMPLEs are timed
IMAGE_STACK = 4


def _cartpole(rows: int, seed: int) -> dict[str, Any]:
    import numpy as np

    from rlbench.kit.bench import cartpole_batch

    return cartpole_batch(np.random.default_rng(seed), rows)


def _p50_p99(samples: list[int]) -> tuple[float, float]:
    import numpy as np

    p50, p99 = np.percentile(np.asarray(samples, dtype=np.float64) / 1e3, [50, 99])
    return float(p50), float(p99)


def _timed_block(call: Callable[[], Any], requests: int, into: list[int]) -> None:
    clock = time.perf_counter_ns
    for i in range(requests + WARM_UP):
        started = clock()
        call()
        if i >= WARM_UP:
            into.append(clock() - started)


def _insert_rate(node: Any, batch: dict[str, Any], seconds: float) -> float:
    sent, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        node.actor.add(batch)
        sent += THROUGHPUT_ROWS
    return sent / (time.perf_counter() - started)


def measure_transport(name: str, options: dict[str, Any], replay: str, batch_size: int, requests: int,
                      seconds: float, *, image: bool = False) -> dict[str, Any]:
    """One transport: the echo server stays up while each path's node serves in turn (two polling
    servers at a time, not three, on a small machine); within a node's turn, blocks of its requests
    alternate with blocks of echoes, which are pooled over both turns."""
    from rlbench.kit.access import message_bytes, replay_node, time_shares, wire_echo

    one, batch = _cartpole(1, seed=1), _cartpole(batch_size, seed=2)
    sizes = {"INSERT": message_bytes("INSERT", one), "SAMPLE": message_bytes("SAMPLE", batch)}
    wire: dict[int, list[int]] = {size: [] for size in (WIRE_FLOOR_BYTES, *sizes.values())}
    per_block = max(1, requests // BLOCKS)
    paths: dict[str, dict[str, Any]] = {}
    with wire_echo(name, transport_options=options) as round_trip:
        for path in ("fast", "general"):
            times: dict[str, list[int]] = {"INSERT": [], "SAMPLE": []}
            with replay_node(name, transport_options=options, replay=replay, fast_path=path == "fast") as node:
                node.actor.add(_cartpole(4096, seed=3))  # enough items to sample from
                before = node.histograms()
                for _ in range(BLOCKS):
                    for size, samples in wire.items():
                        _timed_block(lambda: round_trip(size), per_block, samples)
                    _timed_block(lambda: node.actor.add(one), per_block, times["INSERT"])
                    _timed_block(lambda: node.learner.sample(batch_size, 0.4), per_block, times["SAMPLE"])
                after = node.histograms()
                rate = _insert_rate(node, _cartpole(THROUGHPUT_ROWS, seed=4), seconds)
                paths[path] = {"times": times, "before": before, "after": after, "rate": rate,
                               "fast_path": node.report()["fast_path"]}
        images = (measure_image(name, options, replay, batch_size, requests // 10, seconds, round_trip)
                  if image else None)
    floor = _p50_p99(wire[WIRE_FLOOR_BYTES])[0]
    result: dict[str, Any] = {"available": True, "wire": {str(size): dict(zip(("p50_us", "p99_us"), _p50_p99(samples)))
                                                          for size, samples in wire.items()},
                              "wire_floor_us": floor, "message_bytes": sizes, "fast_path": paths["fast"]["fast_path"],
                              "insert_throughput": {path: got["rate"] for path, got in paths.items()}, "ops": [],
                              **({"image": images} if image else {})}
    for op, label in (("INSERT", "INSERT 1"), ("SAMPLE", f"SAMPLE {batch_size}")):
        for path, got in paths.items():
            p50, p99 = _p50_p99(got["times"][op])
            shares = time_shares(op, p50, _p50_p99(wire[sizes[op]])[0], got["before"], got["after"])
            result["ops"].append({"op": label, "path": path, "p50_us": p50, "p99_us": p99,
                                  "x_wire_floor": p50 / floor, "shares": shares})
    return result


def measure_image(name: str, options: dict[str, Any], replay: str, batch_size: int, requests: int, seconds: float,
                  wire: Any) -> dict[str, Any]:
    """Image INSERTs and SAMPLEs on a frame-storing node, each beside a stream of messages of the size
    it carries (counted by the clients' links) over `wire` (rlbench.kit.access.Wire): blocks of each
    alternate, pooled."""
    from rlbench.kit.access import replay_node
    from rlbench.kit.bench import image_transitions

    chunks = [image_transitions(IMAGE_INSERT_ROWS, seed=seed) for seed in range(IMAGE_STORED // IMAGE_INSERT_ROWS)]
    per_block = max(1, requests // BLOCKS)
    times: dict[str, list[int]] = {"INSERT": [], "SAMPLE": []}
    streams: dict[str, list[float]] = {"INSERT": [], "SAMPLE": []}
    stream_s = max(0.05, seconds / BLOCKS)
    with replay_node(name, transport_options=options, replay=replay, capacity=IMAGE_STORED, batch_size=batch_size,
                     frames=IMAGE_STACK, layout=_atari_layout()) as node:
        clock = time.perf_counter_ns
        sent = node.actor.link_stats()["bytes_sent"]
        for chunk in chunks:  # fills the memory; each INSERT timed
            started = clock()
            node.actor.add(chunk)
            times["INSERT"].append(clock() - started)
        received = node.learner.link_stats()["bytes_received"]
        node.learner.sample(batch_size, 0.4)
        sizes = {"INSERT": (node.actor.link_stats()["bytes_sent"] - sent) // len(chunks),  # what each op carries
                 "SAMPLE": node.learner.link_stats()["bytes_received"] - received}
        following = itertools.cycle(chunks)  # each INSERT a chunk of its own: as many frames stored as an actor's
        for _ in range(BLOCKS):
            for op, size in sizes.items():
                streams[op].append(wire.stream(size, stream_s))
            _timed_block(lambda: node.learner.sample(batch_size, 0.4), per_block, times["SAMPLE"])
            _timed_block(lambda: node.actor.add(next(following)), max(1, per_block // 4), times["INSERT"])
        memory = node.report()["memory"]
    from rlbench.runtime.distributed import messages

    stacked = messages.message_sizes(_atari_spec(), [], insert_rows=IMAGE_INSERT_ROWS, batch_size=batch_size)
    result: dict[str, Any] = {"bytes": sizes, "memory": memory, "ops": {},
                              "stacked_bytes": {"INSERT": stacked["INSERT"], "SAMPLE": stacked["BATCH"]}}
    for op, samples in times.items():
        p50, p99 = _p50_p99(samples)
        mean_s = sum(samples) / len(samples) / 1e9
        achieved = sizes[op] / mean_s
        stream = sum(streams[op]) / len(streams[op])
        result["ops"][op] = {"p50_us": p50, "p99_us": p99, "requests": len(samples), "mb_per_s": achieved / 1e6,
                             "stacked_mb_per_s": result["stacked_bytes"][op] / mean_s / 1e6,
                             "stream_mb_per_s": stream / 1e6, "stream_vs_op": stream / achieved}
    return result


def _atari_spec() -> Any:
    """What an Atari environment's spec says of its transitions (EnvSpec)."""
    from rlbench.protocols import EnvSpec

    return EnvSpec(id="atari", num_envs=1, observation_shape=(IMAGE_STACK, 84, 84), observation_dtype="uint8",
                   action_kind="discrete", n_actions=18, frame_stack=IMAGE_STACK)


def _atari_layout() -> dict[str, Any]:
    """The transitions of an Atari run (rlbench.runtime.transitions.transition_layout of its spec)."""
    from rlbench.runtime import transitions

    return transitions.transition_layout(_atari_spec())


def benchmark_access(transports: list[str], options: dict[str, dict[str, Any]], replay: str, batch_size: int,
                     requests: int, seconds: float, *, image: bool = False) -> dict[str, Any]:
    from rlbench.plugins import get_registry

    registry = get_registry()
    results: dict[str, Any] = {"replay": replay, "requests": requests, "blocks": BLOCKS, "transports": {}}
    for name in transports:
        component = registry.get("transport", name)  # unknown names: "did you mean"
        probe = component.probe()
        if not probe.available:
            results["transports"][name] = {"available": False, "reason": probe.reason}
            continue
        if not component.capabilities.crosses_processes:
            results["transports"][name] = {"available": False, "reason": "does not cross processes: the node "
                                           "runs in its own"}
            continue
        results["transports"][name] = measure_transport(name, options.get(name, {}), replay, batch_size, requests,
                                                        seconds, image=image)
    return results


def _share(shares: dict[str, Any], name: str) -> str:
    return f"{shares[f'{name}_us']:>6.1f} {shares['percent'][name]:>4.0f}%"


def format_table(results: dict[str, Any]) -> str:
    lines = [f"replay access (memory {results['replay']}, CartPole transitions), all measured in this run: one "
             f"client thread; each path's node in turn, {results['blocks']} blocks of its requests alternating "
             "with blocks of echoes; p50/p99 in us"]
    header = (f"{'op':<10}{'path':<9}{'p50':>7}{'p99':>8}{'/RTT64':>8}   {'wire':>11} {'node':>11} {'memory':>11}"
              f" {'client':>11}")
    unavailable = []
    for name, entry in results["transports"].items():
        if not entry["available"]:
            unavailable.append(f"{name}: unavailable: {entry['reason']}")
            continue
        lines += ["", f"{name}: wire round trip of {WIRE_FLOOR_BYTES} B p50 {entry['wire_floor_us']:.2f} us "
                      f"(an echo over {name}); fast path: {_fast_path_note(entry['fast_path'])}", header,
                  "-" * len(header)]
        for row in entry["ops"]:
            shares = row["shares"]
            lines.append(f"{row['op']:<10}{row['path']:<9}{row['p50_us']:>7.1f}{row['p99_us']:>8.1f}"
                         f"{row['x_wire_floor']:>7.2f}x   {_share(shares, 'wire')} {_share(shares, 'node')} "
                         f"{_share(shares, 'memory')} {_share(shares, 'client')}")
        rates = entry["insert_throughput"]
        lines.append(f"INSERT throughput, {THROUGHPUT_ROWS} transitions per INSERT, one actor: fast "
                     f"{rates['fast']:,.0f}/s, general {rates['general']:,.0f}/s ({rates['fast'] / rates['general']:.2f}x)")
        if entry.get("image"):
            lines += _image_lines(entry["image"])
    lines += ["", "wire: the transport's own round trip of a message the size of the op's request and reply "
                  "(their mean); node: its handling (serve) less the memory operation; memory: the operation "
                  "inside the node; client: the rest (codec, bookkeeping, both ends' receive loops)"]
    return "\n".join(lines + unavailable)


def _image_lines(image: dict[str, Any]) -> list[str]:
    memory = image["memory"]
    frames = memory.get("frames") or {}
    stored = (f"{frames['frames_held']:,} frames held for {memory.get('size', IMAGE_STORED):,} transitions"
              if "frames_held" in frames else "stacks stored whole")
    header = (f"{'image op':<14}{'bytes':>11}{'p50 ms':>8}{'p99 ms':>8}{'MB/s':>8}{'stream MB/s':>13}{'stream/op':>11}"
              f"{'stacks MB/s':>13}")
    lines = ["", f"image payloads (4x84x84 uint8; the node's memory stores each frame once: {stored}): each op's "
                 "bytes/s beside a one-way stream of messages of the size it carries, over the same transport; "
                 "stacks: the stacked transitions it moves, per second", header, "-" * len(header)]
    for op, label in (("INSERT", f"INSERT {IMAGE_INSERT_ROWS}"), ("SAMPLE", "SAMPLE reply")):
        row = image["ops"][op]
        lines.append(f"{label:<14}{image['bytes'][op]:>11,}{row['p50_us'] / 1e3:>8.2f}{row['p99_us'] / 1e3:>8.2f}"
                     f"{row['mb_per_s']:>8,.0f}{row['stream_mb_per_s']:>13,.0f}{row['stream_vs_op']:>10.2f}x"
                     f"{row['stacked_mb_per_s']:>13,.0f}")
    lines.append(f"(stacked, an INSERT of {IMAGE_INSERT_ROWS} would be {image['stacked_bytes']['INSERT']:,} B and a "
                 f"BATCH of {image['stacked_bytes']['SAMPLE']:,} B: the INSERT carries each frame once, the BATCH each "
                 "row's 5 frames once)")
    return lines


def _fast_path_note(fast_path: dict[str, Any]) -> str:
    if not fast_path.get("on"):
        return f"off ({fast_path.get('why')})"
    return "served " + ", ".join(f"{op} {count:,}" for op, count in fast_path["served"].items())


def _options(pairs: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    options: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        name, _, rest = pair.partition(":")
        key, equals, value = rest.partition("=")
        if not (name and key and equals):
            raise click.BadParameter(f"expected TRANSPORT:KEY=VALUE, got {pair!r}", param_hint="--option")
        options.setdefault(name, {})[key] = int(value) if value.isdigit() else value  # (sizes: ring_bytes, mtu)
    return options


@click.command("access")
@click.option("--transport", "transports", multiple=True, default=DEFAULT_TRANSPORTS, show_default=True,
              help="transports to measure (repeatable); unavailable ones are listed with the reason")
@click.option("--option", "pairs", multiple=True, metavar="TRANSPORT:KEY=VALUE",
              help="a transport option, e.g. dpdk:port=memif (repeatable)")
@click.option("--replay", default="prioritized", show_default=True, help="core memory the node serves")
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(min=1), help="SAMPLE batch")
@click.option("--requests", default=2000, show_default=True, type=click.IntRange(min=BLOCKS),
              help="timed requests per op, path and transport (and echoes per size)")
@click.option("--seconds", default=1.0, show_default=True, type=click.FloatRange(min=0.1),
              help="INSERT throughput time per path")
@click.option("--image/--no-image", default=True, show_default=True,
              help="also image INSERTs and SAMPLE replies (~1.8 MB at 32) beside streams of their sizes")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
def command(transports: tuple[str, ...], pairs: tuple[str, ...], replay: str, batch_size: int, requests: int,
            seconds: float, image: bool, as_json: bool) -> None:
    """Replay INSERT/SAMPLE latency over each transport against the transport's own round trip, the
    node's native fast path beside its general path, each split into wire, node, memory and client."""
    from rlbench.errors import RlbenchError

    try:
        results = benchmark_access(list(transports), _options(pairs), replay, batch_size, requests, seconds,
                                   image=image)
    except RlbenchError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(json.dumps(results, indent=2) if as_json else format_table(results))
