"""`rlbench bench dpdk`: the DPDK experience-sampling paper's comparison, reproduced in one run.

1. Replay access latency: a real replay node (the runtime's ReplayNode, prioritized memory) in a
   spawned process per transport; INSERT and SAMPLE round trips of CartPole-sized transitions
   whose payload spans 64 B .. 64 KB, p50/p99, and DPDK's reduction vs each kernel transport; and
   where each p50 went (rlbench.kit.access.time_shares): the transport's own round trip of a
   message that size (an echo over the same transport, its blocks alternating with the node's),
   the node's own handling, the memory operation, the client's rest.
2. INSERT throughput (32 CartPole transitions per INSERT, as actors send them), DPDK vs kernel.
3. Prioritized sampling seen by the learner, over DPDK: `server` (SAMPLE request, wait) vs
   `in-network` (the node pushes batches ahead on credit), with the same emulated learner step.
4. memif MTU 1500 vs 9000: echo round trips and one-way throughput of 4..64 KB messages against a
   listener in its own process, the MTUs taking turns, frames per message counted by the shim.
The paper's ranges are printed beside the reductions; they come from a 40GbE NIC, ours from memif
(or the port given), so they are context, not a target.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from typing import Any, Iterator

PAPER_ACCESS_REDUCTION = (32.7, 58.9)  # % lower access latency, DPDK vs kernel sockets
PAPER_IN_NETWORK_ACCESS = (11.7, 28.1)  # % lower replay access, in-network vs server
PAPER_IN_NETWORK_SAMPLING = (21.9, 29.1)  # % lower prioritized-sampling communication
TRANSITION_BYTES = 4 * 4 * 2 + 8 + 4 + 1  # CartPole: obs and next_obs float32[4], action, reward, done
BATCH = 32
LEARNER_STEP_US = 500.0  # emulated learner update between samples (a small DQN step is ~1 ms here)


def _transitions(n: int, seed: int = 0) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((n, 4), dtype=np.float32),
            "action": rng.integers(0, 2, n).astype(np.int64),
            "reward": np.ones(n, dtype=np.float32),
            "next_obs": rng.standard_normal((n, 4), dtype=np.float32),
            "done": np.zeros(n, dtype=bool)}


@contextlib.contextmanager
def _node(transport: str, options: dict[str, Any], placement: str) -> Iterator[Any]:
    """The runtime's real replay node (prioritized memory) in its own process; clients as actor and learner."""
    from rlbench.kit.access import replay_node

    with replay_node(transport, transport_options=options, placement=placement, replay="prioritized",
                     batch_size=BATCH) as node:
        yield node


def _percentiles(samples: list[int]) -> tuple[float, float]:
    import numpy as np

    array = np.asarray(samples, dtype=np.float64) / 1e3
    return float(np.percentile(array, 50)), float(np.percentile(array, 99))


ACCESS_BLOCKS = 10  # node requests and echoes take turns in this many blocks per case


def _access(node: Any, round_trip: Any, sizes: tuple[int, ...], requests: int) -> list[dict[str, Any]]:
    from rlbench.kit.access import message_bytes, time_shares

    clock = time.perf_counter_ns
    actor, learner = node.actor, node.learner
    actor.add(_transitions(4096, seed=1))  # enough items for the largest SAMPLE
    cases = []
    per_block = max(1, requests // ACCESS_BLOCKS)
    for size in sizes:
        n = max(1, round(size / TRANSITION_BYTES))
        batch = _transitions(n, seed=size)
        echo_bytes = {"INSERT": message_bytes("INSERT", batch), "SAMPLE": message_bytes("SAMPLE", batch)}
        inserts, samples = [], []
        wire: dict[str, list[int]] = {"INSERT": [], "SAMPLE": []}
        before = node.histograms()
        for _ in range(ACCESS_BLOCKS):
            for i in range(per_block + 20):
                started = clock()
                actor.add(batch)
                middle = clock()
                learner.sample(n, 0.4)
                finished = clock()
                if i >= 20:  # warm-up
                    inserts.append(middle - started)
                    samples.append(finished - middle)
            for op, echo in echo_bytes.items():
                wire[op] += [round_trip(echo) for _ in range(per_block + 20)][20:]
        after = node.histograms()
        insert_p50, insert_p99 = _percentiles(inserts)
        sample_p50, sample_p99 = _percentiles(samples)
        shares = {op.lower(): time_shares(op, p50, _percentiles(wire[op])[0], before, after)
                  for op, p50 in (("INSERT", insert_p50), ("SAMPLE", sample_p50))}
        cases.append({"size": size, "transitions": n, "insert_p50_us": insert_p50, "insert_p99_us": insert_p99,
                      "sample_p50_us": sample_p50, "sample_p99_us": sample_p99, "shares": shares})
    return cases


def _insert_throughput(node: Any, seconds: float = 1.0) -> float:
    batch = _transitions(32, seed=7)
    sent = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        node.actor.add(batch)
        sent += 32
    return sent / (time.perf_counter() - started)


def _spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def _learner(node: Any, placement: str, seconds: float) -> dict[str, Any]:
    """Sample, 'learn' for LEARNER_STEP_US, send priorities back; time only the wait for a batch."""
    import numpy as np

    node.actor.add(_transitions(4096, seed=3))
    learner = node.learner
    waits = []
    clock = time.perf_counter_ns
    in_network = placement == "in-network"
    if in_network:
        learner.credit(2, 0.4)
    end = time.perf_counter() + seconds
    updates = 0
    while time.perf_counter() < end:
        started = clock()
        sample = learner.wait_pushed(30.0) if in_network else learner.sample(BATCH, 0.4)
        waits.append(clock() - started)
        _spin(LEARNER_STEP_US)
        updates += 1
        learner.update_priorities(sample.indices, np.abs(np.random.standard_normal(len(sample.indices))) + 0.01,
                                  learner_updates=updates, credit=1 if in_network else None, beta=0.4)
    p50, p99 = _percentiles(waits[10:])
    return {"placement": placement, "batches": len(waits), "sample_wait_p50_us": p50, "sample_wait_p99_us": p99}


def mtu_node(addresses: Any, mtu: int) -> None:
    """A memif listener with this MTU, in its own process: echoes b"E..." messages, swallows b"S...",
    answers b"C" with the bytes swallowed since the last b"C" (u64), and stops at anything else."""
    from rlbench_dpdk.transport import DpdkTransport

    listener = DpdkTransport("memif", mtu=mtu).listen()
    addresses.put(listener.address)
    swallowed = 0
    try:
        while (got := listener.recv(timeout=60.0)) is not None:
            peer, message = got
            op = bytes(message[:1])
            if op == b"E":
                listener.send(peer, message)
            elif op == b"S":
                swallowed += message.nbytes
            elif op == b"C":
                listener.send(peer, swallowed.to_bytes(8, "little"))
                swallowed = 0
            else:
                return
    finally:
        listener.close()


def _mtu_slice(connection: Any, size: int, requests: int, seconds: float) -> tuple[list[int], int, float, int]:
    """One turn of one MTU: `requests` echo round trips of `size`-byte messages (ns each), then
    `seconds` of one-way messages confirmed whole. Returns (round trips, bytes streamed, seconds
    taken, data frames the round trips' messages took)."""
    from rlbench.errors import RlbenchError

    clock = time.perf_counter_ns
    echo = b"E" + bytes(size - 1)
    frames_before = connection.stats["frames_sent"]
    samples = []
    for _ in range(requests):
        started = clock()
        connection.request(echo, timeout=10.0)
        samples.append(clock() - started)
    frames = connection.stats["frames_sent"] - frames_before
    stream = b"S" + bytes(size - 1)
    sent, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        connection.send(stream)
        sent += size
    received = int.from_bytes(connection.request(b"C", timeout=30.0), "little")
    elapsed = time.perf_counter() - started
    if received != sent:
        raise RlbenchError(f"dpdk MTU benchmark: {sent} B sent, {received} B arrived")
    return samples, sent, elapsed, frames


def run_mtu_comparison(mtus: tuple[int, ...], sizes: tuple[int, ...], requests: int, turns: int = 40,
                       seconds: float = 0.025) -> dict[str, Any]:
    """Each MTU's listener in its own process and a connection of the same MTU here. The MTUs take
    turns many times (each turn: requests/turns round trips and `seconds` of streaming), so that a
    busy machine's swings (a ping-pong is ~5 us with a core each, ~25 us sharing one) fall on every
    MTU alike; round trips are pooled over the turns, throughput is all bytes over all time."""
    from rlbench_dpdk.transport import DpdkTransport

    context = multiprocessing.get_context("spawn")
    nodes, connections = [], {}
    per_turn = max(1, requests // turns)
    try:
        for mtu in mtus:
            addresses = context.Queue()
            process = context.Process(target=mtu_node, args=(addresses, mtu), daemon=True)
            process.start()
            nodes.append(process)
            connections[mtu] = DpdkTransport("memif", mtu=mtu).connect(addresses.get(timeout=60), timeout=10.0)
        cases = []
        for size in sizes:
            for mtu in mtus:  # warm-up
                _mtu_slice(connections[mtu], size, per_turn, seconds)
            samples: dict[int, list[int]] = {mtu: [] for mtu in mtus}
            streamed = dict.fromkeys(mtus, 0)
            taken = dict.fromkeys(mtus, 0.0)
            frames = dict.fromkeys(mtus, 0)
            for _ in range(turns):
                for mtu in mtus:
                    turn_samples, sent, elapsed, turn_frames = _mtu_slice(connections[mtu], size, per_turn, seconds)
                    samples[mtu] += turn_samples
                    streamed[mtu] += sent
                    taken[mtu] += elapsed
                    frames[mtu] += turn_frames
            for mtu in mtus:
                p50, p99 = _percentiles(samples[mtu])
                cases.append({"mtu": mtu, "size": size, "p50_us": p50, "p99_us": p99,
                              "mb_per_s": streamed[mtu] / taken[mtu] / 1e6,
                              "frames_per_message": frames[mtu] / len(samples[mtu])})
        return {"mtus": list(mtus), "turns": turns, "requests": per_turn * turns, "cases": cases}
    finally:
        for connection in connections.values():
            connection.send(b"Q")
            connection.close()
        for process in nodes:
            process.join(10)
            if process.is_alive():
                process.kill()


def _format_mtu(comparison: dict[str, Any]) -> list[str]:
    baseline_mtu = comparison["mtus"][0]
    lines = [f"memif MTU: echo round trips and one-way throughput, {comparison['requests']} round trips per case in "
             f"{comparison['turns']} turns, the MTUs alternating; frames per message counted by the shim",
             f"{'size B':>8}{'MTU':>6}{'frames/msg':>12}{'p50 us':>10}{'p99 us':>10}{'MB/s':>10}"]
    baseline = {case["size"]: case for case in comparison["cases"] if case["mtu"] == baseline_mtu}
    for case in comparison["cases"]:
        base = baseline[case["size"]]
        note = "" if case["mtu"] == baseline_mtu else (
            f"   p50 {_reduction(case['p50_us'], base['p50_us']):5.1f} % lower, throughput "
            f"{case['mb_per_s'] / base['mb_per_s']:.2f}x vs MTU {baseline_mtu}")
        lines.append(f"{case['size']:>8}{case['mtu']:>6}{case['frames_per_message']:>12.1f}{case['p50_us']:>10.1f}"
                     f"{case['p99_us']:>10.1f}{case['mb_per_s']:>10.0f}{note}")
    return lines


def _reduction(ours: float, baseline: float) -> float:
    return 100.0 * (1.0 - ours / baseline) if baseline > 0 else float("nan")


def run_reproduction(transports: list[str], sizes: tuple[int, ...], requests: int, dpdk_port: str,
                     placement_seconds: float | None) -> dict[str, Any]:
    import rlbench
    from rlbench.errors import RlbenchError
    from rlbench.kit.access import wire_echo

    registry = rlbench.get_registry()
    results: dict[str, Any] = {"sizes": list(sizes), "requests": requests, "dpdk_port": dpdk_port,
                               "access": {}, "insert_throughput": {}, "unavailable": {}}
    for name in transports:
        component = registry.get("transport", name)  # unknown names: "did you mean"
        probe = component.probe()
        if not probe.available:
            results["unavailable"][name] = probe.reason
            continue
        options = {"port": dpdk_port} if name == "dpdk" else {}
        with wire_echo(name, transport_options=options) as round_trip, _node(name, options, "server") as node:
            results["access"][name] = _access(node, round_trip, sizes, requests)
            results["insert_throughput"][name] = _insert_throughput(node)
    if "dpdk" not in results["access"]:
        raise RlbenchError("dpdk is unavailable here: " + results["unavailable"].get("dpdk", "not selected"))
    if placement_seconds:
        results["placement"] = {}
        for placement in ("server", "in-network"):
            with _node("dpdk", {"port": dpdk_port}, placement) as node:
                results["placement"][placement] = _learner(node, placement, placement_seconds)
    return results


def run_veth(sizes: tuple[int, ...], requests: int) -> dict[str, Any]:
    """Echo round trips across a veth pair between two namespaces: kernel UDP, DPDK af_packet and
    af_xdp, each side a separate process (the closest single-machine stand-in for the NIC path)."""
    from rlbench_dpdk.veth import measure_over_veth, veth_pair

    measured: dict[str, Any] = {}
    with veth_pair() as pair:
        for label, name, kind in (("udp", "udp", None), ("af_packet", "dpdk", "af_packet"), ("af_xdp", "dpdk", "af_xdp")):
            try:
                measured[label] = measure_over_veth(pair, name, kind, list(sizes), requests)["cases"]
            except Exception as exc:  # one port kind failing (e.g. no XDP support) must not hide the others
                measured[label] = {"error": f"{type(exc).__name__}: {str(exc)[-300:]}"}
    return measured


def _format_veth(veth: dict[str, Any]) -> list[str]:
    lines = ["echo round trips over a veth pair between two network namespaces (us), vs kernel UDP on the same veth"]
    udp = {case["size"]: case for case in veth.get("udp", [])} if isinstance(veth.get("udp"), list) else {}
    for label, cases in veth.items():
        if isinstance(cases, dict):
            lines.append(f"  {label}: failed: {cases['error']}")
            continue
        for case in cases:
            base = udp.get(case["size"])
            note = f"   {_reduction(case['p50_us'], base['p50_us']):6.1f} % vs udp" if base and label != "udp" else ""
            lines.append(f"  {label:<10}{case['size']:>8}{case['p50_us']:>10.1f}{case['p99_us']:>10.1f}{note}")
    return lines


def _format_shares(results: dict[str, Any]) -> list[str]:
    lines = ["where each p50 went (us, % of it; all measured): wire = the transport's own round trip of a message "
             "that size (an echo, blocks alternating with the node's); node = its handling less the memory "
             "operation; memory = the operation inside the node; client = the rest (codec, bookkeeping, loops)",
             f"{'op':<7}{'size B':>8}{'transport':>11}{'p50':>10}{'wire':>13}{'node':>13}{'memory':>13}{'client':>13}"]
    for op in ("insert", "sample"):
        for size in results["sizes"]:
            for name, cases in results["access"].items():
                shares = next(c for c in cases if c["size"] == size)["shares"][op]
                cells = "".join(f"{shares[f'{part}_us']:>7.1f} {shares['percent'][part]:>4.0f}%"
                                for part in ("wire", "node", "memory", "client"))
                lines.append(f"{op.upper():<7}{size:>8}{name:>11}{shares['measured_us']:>10.1f}{cells}")
    return lines


def format_table(results: dict[str, Any]) -> str:
    access = results["access"]
    dpdk = {case["size"]: case for case in access["dpdk"]}
    kernels = [name for name in access if name != "dpdk"]
    lines = [f"replay access round trips (us), {results['requests']} per case, DPDK port {results['dpdk_port']}; "
             f"paper: DPDK {PAPER_ACCESS_REDUCTION[0]}..{PAPER_ACCESS_REDUCTION[1]} % below kernel sockets"]
    header = f"{'op':<7}{'size B':>8}{'transport':>11}{'p50':>10}{'p99':>10}   DPDK p50 reduction"
    lines += [header, "-" * len(header)]
    for op in ("insert", "sample"):
        for size in results["sizes"]:
            for name, cases in access.items():
                case = next(c for c in cases if c["size"] == size)
                p50, p99 = case[f"{op}_p50_us"], case[f"{op}_p99_us"]
                note = "" if name == "dpdk" else f"   {_reduction(dpdk[size][f'{op}_p50_us'], p50):6.1f} % vs {name}"
                lines.append(f"{op.upper():<7}{size:>8}{name:>11}{p50:>10.1f}{p99:>10.1f}{note}")
    lines += _format_shares(results)
    throughput = results["insert_throughput"]
    lines.append("INSERT throughput, 32 CartPole transitions per INSERT: " + ", ".join(
        f"{name} {rate:,.0f}/s" for name, rate in throughput.items()) + "".join(
        f"; dpdk/{name} {throughput['dpdk'] / throughput[name]:.2f}x" for name in kernels))
    placement = results.get("placement")
    if placement:
        server, near = placement["server"], placement["in-network"]
        lines.append(f"prioritized sampling seen by the learner over DPDK (batch {BATCH}, learner step "
                     f"{LEARNER_STEP_US:.0f} us): server p50 {server['sample_wait_p50_us']:.1f} / p99 "
                     f"{server['sample_wait_p99_us']:.1f} us; in-network p50 {near['sample_wait_p50_us']:.1f} / p99 "
                     f"{near['sample_wait_p99_us']:.1f} us; reduction p50 "
                     f"{_reduction(near['sample_wait_p50_us'], server['sample_wait_p50_us']):.1f} % "
                     f"(paper: {PAPER_IN_NETWORK_SAMPLING[0]}..{PAPER_IN_NETWORK_SAMPLING[1]} % sampling communication, "
                     f"{PAPER_IN_NETWORK_ACCESS[0]}..{PAPER_IN_NETWORK_ACCESS[1]} % replay access)")
    if "mtu" in results:
        lines += _format_mtu(results["mtu"])
    if "veth" in results:
        lines += _format_veth(results["veth"])
    for name, reason in results["unavailable"].items():
        lines.append(f"{name}: unavailable: {reason}")
    return "\n".join(lines)
