"""`rlbench bench attacks`: the replay node against peers that would crash, stall or poison it.

For each transport and each attack, in one run: the runtime's real replay node in its own process
(rlbench.kit.access, with the run's authentication and a CartPole run's transition layout), an
attacker in another process doing one thing a broken or hostile peer could do, and meanwhile, in
this process, an honest actor: a fresh connection's handshake now and then, and STATUS and INSERT
round trips. Printed per attack: the honest actor's round trips during the attack (p50, p99 and the
longest: a stall shows there), the node's peak resident memory growth, what the node counted (its
refusals, drops and forgotten peers), and whether the node still serves. The targets of issue #21:
no honest round trip longer than 100 ms, and at most 50 MiB of growth, under every attack.

All figures are measured on this machine (its load is printed: the attacker, the node and the honest
actor share its cores). Only click is imported at module level.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import click

STALL_TARGET_MS = 100.0
GROWTH_TARGET_MIB = 50.0
DEFAULT_TRANSPORTS = ("tcp", "shm", "udp")
HONEST_INDEX = 100  # the honest actor's index (attackers use others)
HANDSHAKE_EVERY = 50  # honest round trips between fresh connections
HONEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Attack:
    name: str
    what: str
    rate_limit: tuple[float, int, float] = (1.0, 1, 1e18)  # the node's limiter (kit.access's default: never holds)
    honest_inserts: bool = True  # False where the limiter holds every actor (the honest one too)
    transports: tuple[str, ...] = ()  # () = every transport


ATTACKS = (
    Attack("retried-inserts", "an actor retries one INSERT (one request id) 20k times (issue #21: none_dealloc)"),
    Attack("refused-inserts", "an actor sends 20k INSERTs refused for their dtype"),
    Attack("slow-reader", "an authenticated actor floods STATUS and never reads a reply"),
    Attack("stranger-flood", "a peer without the secret floods STATUS and never reads, reconnecting when dropped"),
    Attack("waiting-samples", "the learner sends SAMPLEs the node cannot serve yet, without reading",
           rate_limit=(1.0, 10 ** 9, 1e18)),
    Attack("held-inserts", "an actor pipelines INSERTs the rate limiter holds, without reading",
           rate_limit=(1.0, 1, 0.0), honest_inserts=False),
    Attack("short-connections", "20k short connections of a stranger (connect, STATUS, close)"),
    Attack("layout-poison", "a hostile actor's first INSERT is (8, 7) float64, then honest CartPole INSERTs"),
    Attack("impersonation", "an actor authenticates as the launcher and the learner, and sends SHUTDOWN"),
    Attack("produced-claim", "an INSERT of 4 transitions claims produced = 2**53"),
    Attack("sequence-jump", "a udp peer jumps its sequence numbers by 2**30", transports=("udp",)),
)
ATTACK_NAMES = tuple(attack.name for attack in ATTACKS)


def _cartpole_layout() -> dict[str, Any]:
    from rlbench.protocols import EnvSpec
    from rlbench.runtime.transitions import transition_layout

    return transition_layout(EnvSpec(id="CartPole-v1", num_envs=1, observation_shape=(4,),
                                              observation_dtype="float32", action_kind="discrete", n_actions=2))


# ------------------------------------------------------------------------------------ attacker
def _attacker_main(attack: str, transport: str, options: dict[str, Any], address: str, secret: bytes,
                   seconds: float, started: Any, results: Any) -> None:
    """One attack against the node at `address`, for at most `seconds`; puts what happened."""
    try:
        outcome = _attack(attack, transport, options, address, secret, seconds, started.set)
    except Exception as exc:  # the attacker's own failure is a finding, not a crash of the bench
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
    started.set()
    results.put(outcome)


def _attack(attack: str, transport: str, options: dict[str, Any], address: str, secret: bytes, seconds: float,
            ready: Callable[[], None]) -> dict[str, Any]:
    import numpy as np

    from rlbench.kit.bench import cartpole_batch
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed import messages
    from rlbench.runtime.distributed.channel import Channel, RemoteError
    from rlbench.runtime.distributed.messages import Op, encode, joined

    component = get_registry().get("transport", transport)
    reliable = component.capabilities.reliable

    def connection() -> Any:
        return component.create(**options).connect(address, timeout=10)

    def channel(role: str, index: int, key_role: str | None = None, key_index: int | None = None) -> Channel:
        opened = Channel(connection(), reliable=reliable, timeout=10)
        opened.authenticate(role, index, messages.role_key(secret, key_role or role, index if key_index is None
                                                           else key_index))
        return opened

    rng = np.random.default_rng(21)
    rows = {**cartpole_batch(rng, 4), "produced": np.int64(4)}
    deadline = time.monotonic() + seconds
    ready()

    def flood(raw: Any, message: bytes, limit: int) -> tuple[int, bool]:
        """Send `message` up to `limit` times without reading; (sent, dropped by the node)."""
        for sent in range(limit):
            if time.monotonic() > deadline:
                return sent, False
            try:
                raw.send(message)
            except ConnectionError:
                return sent, True
        return limit, False

    if attack in ("retried-inserts", "refused-inserts"):
        actor = channel("actor", 1)
        body = rows if attack == "retried-inserts" else {**rows, "obs": rows["obs"].astype(np.float64)}
        message = joined(encode(Op.INSERT, body, 7))
        answered = 0
        for _ in range(20_000):
            if time.monotonic() > deadline:
                break
            actor.connection.send(message)
            if actor.connection.recv(timeout=10) is None:
                return {"answered": answered, "stalled": True}
            answered += 1
        return {"answered": answered}
    if attack == "slow-reader":
        sent, dropped = flood(channel("actor", 1).connection, joined(encode(Op.STATUS, {}, 9)), 10 ** 7)
        return {"sent": sent, "dropped": dropped}
    if attack == "stranger-flood":
        connections = sent = 0
        status = joined(encode(Op.STATUS, {}, 9))
        while time.monotonic() < deadline:
            connections += 1
            more, _ = flood(connection(), status, 10 ** 6)
            sent += more
        return {"sent": sent, "connections": connections}
    if attack == "waiting-samples":
        learner = channel("learner", 0)
        sent, dropped = flood(learner.connection, joined(encode(Op.SAMPLE, {"batch_size": np.int64(32),
                                                                            "beta": np.float64(0.4)}, 9)), 50_000)
        return {"sent": sent, "dropped": dropped}
    if attack == "held-inserts":
        actor = channel("actor", 1)
        sent = dropped = 0
        for request_id in range(1, 400_001):  # each its own request: a retry would not be stored again
            if time.monotonic() > deadline:
                break
            try:
                actor.connection.send(*encode(Op.INSERT, rows, request_id))
            except ConnectionError:
                dropped = 1
                break
            sent += 1
        return {"sent": sent, "dropped": bool(dropped)}
    if attack == "short-connections":
        made = 0
        status = joined(encode(Op.STATUS, {}, 9))
        for _ in range(20_000):
            if time.monotonic() > deadline:
                break
            raw = connection()
            raw.send(status)
            raw.recv(timeout=10)
            raw.close()
            made += 1
        return {"connections": made}
    if attack == "layout-poison":
        odd = {"obs": np.ones((3, 8, 7)), "action": np.zeros(3, np.int64), "reward": np.ones(3, np.float32),
               "next_obs": np.ones((3, 8, 7)), "done": np.zeros(3, np.float32), "produced": np.int64(3)}
        try:
            channel("actor", 1).request(Op.INSERT, odd)
            return {"hostile first INSERT": "accepted"}
        except RemoteError as exc:
            return {"hostile first INSERT": f"refused ({str(exc)[:60]}...)"}
    if attack == "impersonation":
        outcome = {}
        for role in ("launcher", "learner"):
            try:
                channel(role, 0, key_role="actor", key_index=1)
                outcome[f"as {role}"] = "accepted"
            except RemoteError:
                outcome[f"as {role}"] = "refused"
        try:
            channel("actor", 1).request(Op.SHUTDOWN)
            outcome["SHUTDOWN"] = "accepted"
        except RemoteError:
            outcome["SHUTDOWN"] = "refused"
        return outcome
    if attack == "produced-claim":
        try:
            channel("actor", 1).request(Op.INSERT, {**rows, "produced": np.int64(2 ** 53)})
            return {"claim": "accepted"}
        except RemoteError:
            return {"claim": "refused"}
    if attack == "sequence-jump":
        return _jump_sequence(address)
    raise ValueError(f"unknown attack {attack!r}")


def _jump_sequence(address: str) -> dict[str, Any]:
    """Datagrams of the udp transport's own format whose sequence numbers jump by 2**30."""
    import socket

    from rlbench.builtin.transports.udp import _DATA, _HEADER, _MAGIC, _VERSION

    host, port = address.removeprefix("udp://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for i in range(1000):
            seq = (i * (1 << 30)) & 0xFFFFFFFF
            sock.sendto(_HEADER.pack(_MAGIC, _VERSION, _DATA, seq, 0, 1, 2, 8168) + b"RB", (host.strip("[]"), int(port)))
    finally:
        sock.close()
    return {"datagrams": 1000}


# --------------------------------------------------------------------------------- honest actor
@dataclass
class Probe:
    round_trips_ms: list[float] = field(default_factory=list)
    handshakes_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    timeouts: int = 0  # requests sent again after no answer came within the timeout (unreliable transports)


def _honest(node: Any, transport: str, options: dict[str, Any], seconds: float, inserts: bool,
            timeout: float) -> Probe:
    import numpy as np

    from rlbench.kit.bench import cartpole_batch
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed import messages
    from rlbench.runtime.distributed.channel import Channel
    from rlbench.runtime.distributed.messages import Op

    component = get_registry().get("transport", transport)
    batch = cartpole_batch(np.random.default_rng(5), 4)
    probe = Probe()
    clock = time.perf_counter
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = clock()
        try:
            channel = Channel(component.create(**options).connect(node.address, timeout=timeout),
                              reliable=component.capabilities.reliable, timeout=timeout)
            channel.authenticate("actor", HONEST_INDEX, messages.role_key(node.secret, "actor", HONEST_INDEX))
        except Exception as exc:
            probe.failures.append(f"handshake: {type(exc).__name__}: {exc}")
            return probe
        probe.handshakes_ms.append((clock() - started) * 1e3)
        try:
            for _ in range(HANDSHAKE_EVERY):
                started = clock()
                channel.request(Op.STATUS)
                if inserts:
                    channel.request(Op.INSERT, {**batch, "produced": np.int64(4)})
                probe.round_trips_ms.append((clock() - started) * 1e3)
                if time.monotonic() >= deadline:
                    break
        except Exception as exc:
            probe.failures.append(f"{type(exc).__name__}: {exc}")
            return probe
        finally:
            probe.timeouts += channel.recorder.counters.get("request_timeouts", 0)
            channel.close()
    return probe


# ------------------------------------------------------------------------------------------ run
def _counters_moved(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """What the node counted during the attack: its own counters and its link's peer faults."""
    moved = {}
    for source in ("counters", "link"):
        old, new = before.get(source, {}), after.get(source, {})
        for name, value in new.items():
            if not isinstance(value, (int, float)):
                continue
            if source == "link" and name not in ("slow_consumers", "dropped_peers", "malformed", "lost",
                                                 "refused_oversize"):
                continue
            if name.startswith(("joined.", "send_failed.TransportClosed")):
                continue
            delta = value - old.get(name, 0)
            if delta:
                moved[name if source == "counters" else f"link.{name}"] = int(delta)
    return moved


def run_attack(attack: Attack, transport: str, options: dict[str, Any], seconds: float,
               timeout: float = HONEST_TIMEOUT_S) -> dict[str, Any]:
    """One attack on a fresh node; `timeout`: how long the honest actor waits for one answer before
    it counts a failure (over an unreliable transport, before it sends the request again)."""
    import multiprocessing

    import numpy as np

    from rlbench.kit.access import replay_node

    context = multiprocessing.get_context("spawn")
    with replay_node(transport, transport_options=options, rate_limit=attack.rate_limit, capacity=1 << 16,
                     layout=_cartpole_layout()) as node:
        before = node.report()
        started, results = context.Event(), context.Queue()
        attacker = context.Process(target=_attacker_main, daemon=True,
                                   args=(attack.name, transport, options, node.address, node.secret, seconds, started,
                                         results))
        attacker.start()
        started.wait(60)
        probe = _honest(node, transport, options, seconds, attack.honest_inserts, timeout)
        attacker.join(seconds + 60)
        if attacker.is_alive():
            attacker.kill()
            attacker.join(5)
        outcome = results.get(timeout=5) if not results.empty() else {"error": "the attacker reported nothing"}
        results.close()
        try:
            after = node.report()
            alive = True
        except Exception as exc:
            after, alive = {}, False
            probe.failures.append(f"the node did not answer STATS after the attack: {exc}")
    times = np.asarray(probe.round_trips_ms or [np.nan])
    growth = (after.get("max_rss_bytes", 0) - before.get("max_rss_bytes", 0)) / (1 << 20) if alive else float("nan")
    longest = float(np.nanmax(np.concatenate([times, probe.handshakes_ms or [np.nan]])))
    return {"attack": attack.name, "transport": transport, "what": attack.what,
            "honest_round_trips": len(probe.round_trips_ms),
            "p50_ms": float(np.nanpercentile(times, 50)), "p99_ms": float(np.nanpercentile(times, 99)),
            "longest_ms": longest,
            "handshake_p50_ms": float(np.median(probe.handshakes_ms)) if probe.handshakes_ms else float("nan"),
            "handshake_longest_ms": float(np.max(probe.handshakes_ms)) if probe.handshakes_ms else float("nan"),
            "round_trip_longest_ms": float(np.nanmax(times)),
            "node_growth_mib": growth, "node_alive": alive, "node_counted": _counters_moved(before, after),
            "attacker": outcome, "failures": probe.failures, "honest_timeouts": probe.timeouts,
            "within_targets": alive and not probe.failures and longest <= STALL_TARGET_MS
            and growth <= GROWTH_TARGET_MIB}


def format_rows(rows: list[dict[str, Any]], state: str) -> str:
    lines = [f"replay node under attack (honest actor's STATUS+INSERT round trips while it lasts; targets: longest "
             f"<= {STALL_TARGET_MS:.0f} ms, node growth <= {GROWTH_TARGET_MIB:.0f} MiB); all measured",
             f"  {state}",
             f"  {'transport':<9} {'attack':<18} {'trips':>6} {'p50 ms':>7} {'p99 ms':>7} {'longest':>8} "
             f"{'growth MiB':>10}  {'ok':<3} node counted / attacker"]
    for row in rows:
        counted = ", ".join(f"{k}={v}" for k, v in sorted(row["node_counted"].items())) or "-"
        attacker = ", ".join(f"{k}={v}" for k, v in row["attacker"].items())
        lines.append(f"  {row['transport']:<9} {row['attack']:<18} {row['honest_round_trips']:>6} {row['p50_ms']:>7.2f} "
                     f"{row['p99_ms']:>7.2f} {row['longest_ms']:>8.1f} {row['node_growth_mib']:>10.1f}  "
                     f"{'yes' if row['within_targets'] else 'NO':<3} {counted} / {attacker}")
        for failure in row["failures"]:
            lines.append(f"      honest actor: {failure}")
    return "\n".join(lines)


@click.command("attacks")
@click.option("--transport", "transports", multiple=True, default=DEFAULT_TRANSPORTS, show_default=True,
              help="transports to attack the node over (repeatable)")
@click.option("--attack", "attacks", multiple=True, type=click.Choice(ATTACK_NAMES),
              help="attacks to run (repeatable; default: all)")
@click.option("--seconds", default=2.0, show_default=True, type=click.FloatRange(min=0.5),
              help="how long each attack (and the honest actor's probing) lasts")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
def command(transports: tuple[str, ...], attacks: tuple[str, ...], seconds: float, as_json: bool) -> None:
    """The replay node under each attack of issue #21 (crash, stall, flood, poison, impersonation):
    an honest actor's round trips meanwhile, the node's memory growth and what it counted."""
    from rlbench.machine_state import summary_line, watch
    from rlbench.plugins import get_registry

    registry = get_registry()
    chosen = [attack for attack in ATTACKS if not attacks or attack.name in attacks]
    rows = []
    with watch(busy_processes=3) as machine:  # the node, the attacker, the honest actor
        for transport in transports:
            registry.get("transport", transport)  # unknown names: did you mean
            for attack in chosen:
                if attack.transports and transport not in attack.transports:
                    continue
                rows.append(run_attack(attack, transport, {}, seconds))
    if as_json:
        click.echo(json.dumps({"rows": rows, "machine": machine.report()}, indent=1, default=str))
    else:
        click.echo(format_rows(rows, summary_line(machine.report())))
