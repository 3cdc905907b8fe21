"""`rlbench bench attacks`: the replay node against peers that would crash, stall, exhaust or poison it.

For each transport and each attack, in one run: the runtime's real replay node in its own process
(rlbench.kit.access, with the run's authentication and a CartPole run's transition layout), an
attacker in another process doing one thing a broken or hostile peer could do, and in this process an
honest actor (and the run's launcher) whose requests must still be answered. The attacker holds what a
real one would: the key of the one role it compromised (`Attack.compromised`, a per-role key as that
actor or learner holds it, never the run's secret), or nothing at all (a stranger).

Each row prints its figures beside their targets (issues #21 and #40: no honest peer refused, no
honest round trip over 100 ms, node CPU with only idle strangers at most 0.05 s/s, node memory growth
at most 50 MiB, one serve step at most 1 ms with 50k waiting requests, forgetting 12,500 peers within
1 s) and says `held` or `open`. A timing figure that misses its target while other processes used the
machine says `contended, not judged` instead (rlbench.machine_state). Rows are printed as each
completes; a row that raises is printed as `failed` with its reason and the others still run.

A miss that is the stated cost of a design (udp trusts the network path: its README and docstring,
and it refuses to listen off loopback unless told to trust it) says so instead of `open`.

The attacks are data (`ATTACKS`): each names the runner of its row (`Attack.run`, e.g. `concurrent`:
the honest actor's round trips while the attacker works) and the attacker's function (run in its own
process with a `Target`: all it knows). `--quick` makes every attack small, to check the harness,
not the targets. Only click is imported at module level.
"""

from __future__ import annotations

import contextlib
import json
import queue
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import click

STALL_TARGET_MS = 100.0
GROWTH_TARGET_MIB = 50.0
IDLE_CPU_TARGET = 0.05  # node CPU s/s with only idle strangers connected
STEP_TARGET_MS = 1.0  # one serve step with the mass row's requests waiting
FORGET_TARGET_S = 1.0  # from a mass departure until the node has forgotten every departed peer
DEFAULT_TRANSPORTS = ("tcp", "shm", "udp")
HONEST_INDEX = 100  # the honest actor's index (attackers use others)
HANDSHAKE_EVERY = 50  # honest round trips between fresh connections
HONEST_TIMEOUT_S = 10.0
COMMON_DESCRIPTOR_LIMIT = 1024  # the soft `ulimit -n` most hosts start processes with
UDP_MAX_GAP = 1 << 16  # udp's gap window: the most one datagram may claim lost (issue #40 item 3)
RELEASE_AFTER_S = 300.0  # an attacker left waiting this long closes what it holds anyway


@dataclass(frozen=True)
class Setting:
    """How big each attack is: the issues' sizes by default; QUICK for the harness's own tests."""

    seconds: float = 2.0  # how long a concurrent attack (and the honest actor's probing) lasts
    strangers: int = 1_100  # udp HELLOs, idle tcp connections: past udp's 1,024 peers and the common descriptor limit
    sequence_jumps: int = 40_000  # udp datagrams each jumping the sequence by UDP_MAX_GAP
    identities: int = 12_500  # mass-disconnects: learner connections, each with `waiting_each` SAMPLEs waiting
    waiting_each: int = 4
    build_s: float = 90.0  # the most the mass row spends connecting them (on a node whose work is O(waiting))
    idle_window_s: float = 2.0  # how long the node's CPU is measured with only idle strangers
    honest_timeout_s: float = HONEST_TIMEOUT_S
    transport_options: tuple[tuple[str, Any], ...] = ()

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.transport_options)


DEFAULT_SETTING = Setting()
QUICK = Setting(seconds=0.5, strangers=40, sequence_jumps=200, identities=30, build_s=10.0, idle_window_s=0.5)


@dataclass(frozen=True)
class Attack:
    """One row per transport it applies to: `run(attack, transport, setting)` starts the node, the
    attacker (`attacker`, handed `compromised`'s key) and the honest peers, and returns the row."""

    name: str
    what: str
    run: Callable[["Attack", str, Setting], dict[str, Any]]  # the row: node, attacker, honest peers, checks
    attacker: Callable[..., dict[str, Any]] | None = None  # what runs in the attacker's process (Target, ready, held)
    compromised: tuple[str, int] | None = ("actor", 1)  # the role whose key the attacker holds; None: a stranger
    rate_limit: tuple[float, int, float] = (1.0, 1, 1e18)  # the node's limiter (kit.access's default: never holds)
    honest_inserts: bool = True  # False where the limiter holds every actor (the honest one too)
    transports: tuple[str, ...] = ()  # () = every transport
    judge: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], list[dict[str, Any]]] | None = None  # more checks
    # the node's descriptor limits: (soft at its start, hard put on it once started: None keeps this host's)
    node_descriptors: tuple[int | None, int | None] | None = None


@dataclass(frozen=True)
class Target:
    """What an attacker knows: where the node is, the key of the role it compromised (None: a stranger's
    nothing), how big the attack is, and what it saw on the network path (`seen`)."""

    attack: str
    transport: str
    address: str
    key: bytes | None
    setting: Setting
    seen: dict[str, Any] = field(default_factory=dict)
    keys: tuple[bytes, ...] = ()  # mass-disconnects: one key per learner connection, as each learner holds its own


def attacker_key(attack: Attack, secret: bytes) -> bytes | None:
    """The one key an attack's attacker is handed: its compromised role's (messages.role_key), or none."""
    from rlbench.runtime.distributed import messages

    return None if attack.compromised is None else messages.role_key(secret, *attack.compromised)


def _cartpole_layout() -> dict[str, Any]:
    from rlbench.protocols import EnvSpec
    from rlbench.runtime.transitions import transition_layout

    return transition_layout(EnvSpec(id="CartPole-v1", num_envs=1, observation_shape=(4,),
                                              observation_dtype="float32", action_kind="discrete", n_actions=2))


# ------------------------------------------------------------------------------------ checks
def check(what: str, figure: float, target: float, unit: str, *, timing: bool = False,
          excused: str = "") -> dict[str, Any]:
    """One figure beside its target (at most); `timing`: a duration, not judged on a contended machine;
    `excused`: the design a miss is the stated cost of (the row says so instead of open)."""
    return {"what": what, "figure": figure, "target": target, "unit": unit, "timing": timing, "excused": excused,
            "held": figure == figure and figure <= target}  # (nan never holds)


def verdict(checks: list[dict[str, Any]], contended: bool) -> str:
    missed = [one for one in checks if not one["held"]]
    if not missed:
        return "held"
    excuses = {one["excused"] for one in missed}
    if len(excuses) == 1 and "" not in excuses:
        return excuses.pop()
    if contended and all(one["timing"] for one in missed):
        return "contended, not judged"
    return "open"


def _contended(machine: dict[str, Any]) -> bool:
    """Did other processes (or the hypervisor) take the cores? The row's own processes sharing them are
    the bench's condition, the one its targets were set for."""
    from rlbench.machine_state import CONTENDED_OTHER_CORES, CONTENDED_STEAL

    return ((machine.get("other_processes_cores") or 0.0) > CONTENDED_OTHER_CORES
            or (machine.get("steal_fraction") or 0.0) > CONTENDED_STEAL)


# ------------------------------------------------------------------------------------ attacker
def _attacker_main(attacker: Callable[..., dict[str, Any]], target: Target, started: Any, release: Any,
                   results: Any) -> None:
    """One attack against the node; puts what happened, then holds what it opened until released."""
    from rlbench.kit.framing import raise_descriptor_limit

    raise_descriptor_limit()  # an attacker may hold thousands of sockets
    held: list[Any] = []
    try:
        outcome = attacker(target, started.set, held)
    except Exception as exc:  # the attacker's own failure is a finding, not a crash of the bench
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
    started.set()
    results.put(outcome)
    release.wait(RELEASE_AFTER_S)
    for opened in held:  # all at once: a mass disconnect
        with contextlib.suppress(Exception):
            opened.close()
    results.put({"closed": len(held)})


class _Attacker:
    """The attacker's process: started, its outcome read, then released (it closes what it held)."""

    def __init__(self, attack: Attack, target: Target) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.started, self.release, self.results = context.Event(), context.Event(), context.Queue()
        self.process = context.Process(target=_attacker_main, daemon=True,
                                       args=(attack.attacker, target, self.started, self.release, self.results))

    def __enter__(self) -> "_Attacker":
        self.process.start()
        self.started.wait(60)
        return self

    def outcome(self, timeout: float) -> dict[str, Any]:
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            return {"error": f"the attacker reported nothing within {timeout:.0f} s"}

    def closed(self, timeout: float = 60.0) -> bool:
        """Release it and wait until it closed what it held."""
        self.release.set()
        try:
            return "closed" in self.results.get(timeout=timeout)
        except queue.Empty:
            return False

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.results.close()


def _attack(target: Target, ready: Callable[[], None], held: list[Any]) -> dict[str, Any]:
    """The attacks of issue #21: each for at most `seconds`, beside the honest actor's round trips."""
    import numpy as np

    from rlbench.kit.bench import cartpole_batch
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed.channel import Channel, RemoteError
    from rlbench.runtime.distributed.messages import Op, encode, joined

    attack, transport, address, key = target.attack, target.transport, target.address, target.key
    component = get_registry().get("transport", transport)
    reliable = component.capabilities.reliable

    def connection() -> Any:
        return component.create(**target.setting.options).connect(address, timeout=10)

    def channel(role: str, index: int) -> Channel:
        """A connection that claims `role` and proves it with the one key the attacker holds."""
        opened = Channel(connection(), reliable=reliable, timeout=10)
        opened.authenticate(role, index, key)
        return opened

    rng = np.random.default_rng(21)
    rows = {**cartpole_batch(rng, 4), "produced": np.int64(4)}
    deadline = time.monotonic() + target.setting.seconds
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
        for role in ("launcher", "learner"):  # with actor 1's key: the only one it holds
            try:
                channel(role, 0)
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


def _udp_datagram(seq: int, payload: bytes) -> bytes:
    """One single-fragment DATA datagram of the udp transport's own format."""
    from rlbench.builtin.transports.udp import _DATA, _HEADER, _MAGIC, _VERSION

    return _HEADER.pack(_MAGIC, _VERSION, _DATA, seq & 0xFFFFFFFF, 0, 1, len(payload), 8168) + payload


def _udp_host_port(address: str) -> tuple[str, int]:
    host, port = address.removeprefix("udp://").rsplit(":", 1)
    return host.strip("[]"), int(port)


def _jump_sequence(address: str) -> dict[str, Any]:
    """A stranger's datagrams whose sequence numbers jump by 2**30."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for i in range(1000):
            sock.sendto(_udp_datagram(i * (1 << 30), b"RB"), _udp_host_port(address))
    finally:
        sock.close()
    return {"datagrams": 1000}


def _udp_strangers(target: Target, ready: Callable[[], None], held: list[Any]) -> dict[str, Any]:
    """Transport HELLOs from `strangers` sockets, one each, no secret: kept open (their ports stay theirs)."""
    import socket

    from rlbench.builtin.transports.udp import _HEADER, _HELLO, _MAGIC, _VERSION

    hello = _HEADER.pack(_MAGIC, _VERSION, _HELLO, 0, 0, 0, 0, 0)
    node = _udp_host_port(target.address)
    for _ in range(target.setting.strangers):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        held.append(sock)
        sock.sendto(hello, node)
    time.sleep(0.2)  # the node takes them in
    return {"hellos": len(held)}


def _idle_connections(target: Target, ready: Callable[[], None], held: list[Any]) -> dict[str, Any]:
    """`strangers` tcp connections that never send a byte, held open."""
    import socket

    host, port = target.address.removeprefix("tcp://").rsplit(":", 1)
    timeouts = 0
    for _ in range(target.setting.strangers):
        try:
            held.append(socket.create_connection((host.strip("[]"), int(port)), timeout=2.0))
        except OSError:  # the node's backlog full: it no longer accepts
            timeouts += 1
            if timeouts >= 8:
                break
    return {"idle connections": len(held), "refused or timed out": timeouts}


def _lost_inflation(target: Target, ready: Callable[[], None], held: list[Any]) -> dict[str, Any]:
    """An authenticated udp peer (its own key) jumps its sequence by UDP_MAX_GAP on every datagram."""
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed.channel import Channel
    from rlbench.runtime.distributed.messages import Op, encode, joined

    component = get_registry().get("transport", "udp")
    actor = Channel(component.create(**target.setting.options).connect(target.address, timeout=10), reliable=False,
                    timeout=10)
    actor.authenticate("actor", 1, target.key)
    held.append(actor)
    ready()
    status = joined(encode(Op.STATUS, {}, 9))
    sock, seq = actor.connection._sock, actor.connection._server.send_seq  # its own session's numbers
    deadline = time.monotonic() + target.setting.seconds
    sent = 0
    while sent < target.setting.sequence_jumps and time.monotonic() < deadline:
        seq += UDP_MAX_GAP
        try:
            sock.send(_udp_datagram(seq, status))
        except (BlockingIOError, TimeoutError):  # its send buffer full: the kernel drops nothing of ours
            continue
        sent += 1
    return {"datagrams": sent}


def _identity_takeover(target: Target, ready: Callable[[], None], held: list[Any]) -> dict[str, Any]:
    """The learner's key, re-authenticated over and over, each connection leaving SAMPLEs waiting."""
    import numpy as np

    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed.channel import Channel
    from rlbench.runtime.distributed.messages import Op, encode, joined

    component = get_registry().get("transport", target.transport)
    sample = joined(encode(Op.SAMPLE, {"batch_size": np.int64(32), "beta": np.float64(0.4)}, 9))
    deadline = time.monotonic() + target.setting.seconds
    connections = sent = 0
    ready()
    while time.monotonic() < deadline:
        learner = Channel(component.create(**target.setting.options).connect(target.address, timeout=10),
                          reliable=component.capabilities.reliable, timeout=10)
        try:
            learner.authenticate("learner", 0, target.key)
        except Exception:  # refused now (e.g. too many tries): that is the node's answer
            learner.close()
            break
        held.append(learner)
        connections += 1
        for _ in range(target.setting.waiting_each + 1):  # one more than one connection may leave waiting
            try:
                learner.connection.send(sample)
                sent += 1
            except ConnectionError:
                break
    return {"authentications": connections, "SAMPLEs sent": sent}


def _many_learners(target: Target, ready: Callable[[], None], held: list[Any]) -> dict[str, Any]:
    """A learner connection per key (each its own identity), `waiting_each` SAMPLEs waiting on each,
    built within `build_s`; all closed at once when released."""
    import numpy as np

    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed.channel import Channel
    from rlbench.runtime.distributed.messages import Op, encode, joined

    component = get_registry().get("transport", target.transport)
    sample = joined(encode(Op.SAMPLE, {"batch_size": np.int64(32), "beta": np.float64(0.4)}, 9))
    started = time.monotonic()
    sent = 0
    for index, key in enumerate(target.keys, start=1):
        if time.monotonic() - started > target.setting.build_s:
            break
        learner = Channel(component.create(**target.setting.options).connect(target.address, timeout=30),
                          reliable=component.capabilities.reliable, timeout=30)
        held.append(learner)
        learner.authenticate("learner", index, key)
        for _ in range(target.setting.waiting_each):
            learner.connection.send(sample)
            sent += 1
    return {"connections": len(held), "SAMPLEs waiting": sent, "build_s": round(time.monotonic() - started, 1)}


def _spoofed_insert(target: Target, ready: Callable[[], None], held: list[Any]) -> dict[str, Any]:
    """An INSERT in the honest actor's session, sent from its address and port (a raw socket writes the
    source) with the sequence number an observer of the path saw next. No key: the session's own."""
    import socket
    import struct

    import numpy as np

    from rlbench.kit.bench import cartpole_batch
    from rlbench.runtime.distributed.messages import Op, encode, joined

    rows = {**cartpole_batch(np.random.default_rng(40), 4), "produced": np.int64(4)}
    datagram = _udp_datagram(target.seen["next_seq"], joined(encode(Op.INSERT, rows, 1 << 20)))
    (source, source_port), (node, node_port) = target.seen["source"], _udp_host_port(target.address)
    try:
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    except PermissionError:
        return {"shown": "no: a raw socket needs CAP_NET_RAW"}
    with raw:
        udp = struct.pack("!HHHH", source_port, node_port, 8 + len(datagram), 0) + datagram  # checksum 0: none (IPv4)
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                         socket.inet_aton(source), socket.inet_aton(node))  # the kernel fills length and checksum
        raw.sendto(ip + udp, (node, 0))
    return {"spoofed INSERT rows": 4, "from": f"{source}:{source_port}"}


# --------------------------------------------------------------------------------- honest actor
@dataclass
class Probe:
    round_trips_ms: list[float] = field(default_factory=list)
    handshakes_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    timeouts: int = 0  # requests sent again after no answer came within the timeout (unreliable transports)


def _honest_channel(node: Any, transport: str, setting: Setting, probe: Probe) -> Any:
    """A fresh honest actor's connection, its handshake timed."""
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed import messages
    from rlbench.runtime.distributed.channel import Channel

    component = get_registry().get("transport", transport)
    started = time.perf_counter()
    channel = Channel(component.create(**setting.options).connect(node.address, timeout=setting.honest_timeout_s),
                      reliable=component.capabilities.reliable, timeout=setting.honest_timeout_s)
    channel.authenticate("actor", HONEST_INDEX, messages.role_key(node.secret, "actor", HONEST_INDEX))
    probe.handshakes_ms.append((time.perf_counter() - started) * 1e3)
    return channel


def _round_trips(channel: Any, probe: Probe, count: int, inserts: bool, until: float = float("inf")) -> bool:
    """`count` STATUS (+ INSERT) round trips, each timed; False at the first failure (recorded)."""
    import numpy as np

    from rlbench.kit.bench import cartpole_batch
    from rlbench.runtime.distributed.messages import Op

    batch = {**cartpole_batch(np.random.default_rng(5), 4), "produced": np.int64(4)}
    try:
        for _ in range(count):
            started = time.perf_counter()
            channel.request(Op.STATUS)
            if inserts:
                channel.request(Op.INSERT, batch)
            probe.round_trips_ms.append((time.perf_counter() - started) * 1e3)
            if time.monotonic() >= until:
                break
    except Exception as exc:
        probe.failures.append(f"{type(exc).__name__}: {exc}")
        return False
    return True


def _close(channel: Any, probe: Probe) -> None:
    probe.timeouts += channel.recorder.counters.get("request_timeouts", 0)
    channel.close()


def _honest(node: Any, transport: str, setting: Setting, inserts: bool) -> Probe:
    """Round trips for `seconds`, a fresh connection's handshake every HANDSHAKE_EVERY of them."""
    probe = Probe()
    deadline = time.monotonic() + setting.seconds
    while time.monotonic() < deadline:
        try:
            channel = _honest_channel(node, transport, setting, probe)
        except Exception as exc:
            probe.failures.append(f"handshake: {type(exc).__name__}: {exc}")
            return probe
        try:
            if not _round_trips(channel, probe, HANDSHAKE_EVERY, inserts, deadline):
                return probe
        finally:
            _close(channel, probe)
    return probe


# ------------------------------------------------------------------------------------------ rows
def _counters_moved(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """What the node counted during the attack: its own counters and its link's peer faults, strangers
    shed, evictions, losses and out-of-descriptor back-offs."""
    from rlbench.kit.framing import ADMISSION_COUNTERS, PEER_FAULTS

    shown = {*PEER_FAULTS, *ADMISSION_COUNTERS, "lost", "evicted_peers", "sequence_resets", "accept_backoffs"}
    moved = {}
    for source in ("counters", "link"):
        old, new = before.get(source, {}), after.get(source, {})
        for name, value in new.items():
            if not isinstance(value, (int, float)):
                continue
            if source == "link" and name not in shown:
                continue
            if name.startswith(("joined.", "send_failed.TransportClosed")):
                continue
            delta = value - old.get(name, 0)
            if delta:
                moved[name if source == "counters" else f"link.{name}"] = int(delta)
    return moved


@contextlib.contextmanager
def _soft_descriptor_limit(soft: int | None) -> Iterator[None]:
    """This process's soft descriptor limit lowered to `soft` while the node is spawned (it inherits
    it, as it would on most hosts), then put back (None: as it is)."""
    import resource

    if soft is None:
        yield
        return
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, old[1]), old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def _node_pid() -> int:
    """The node's process id, before the attacker starts (the node is then this process's one child)."""
    import multiprocessing

    children = multiprocessing.active_children()
    if len(children) != 1:
        raise RuntimeError(f"expected the node as this process's one child, found {len(children)}")
    return children[0].pid


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system), from /proc: read whether or not it answers."""
    import os

    with open(f"/proc/{pid}/stat") as stat:
        user, system = stat.read().rsplit(")", 1)[1].split()[11:13]
    return (int(user) + int(system)) / os.sysconf("SC_CLK_TCK")


def _cap_node_descriptors(hard: int) -> None:
    """Both of the started node's descriptor limits down to `hard` (prlimit: lowering another process's
    limits needs no privilege; raising this process's own back would)."""
    import resource

    resource.prlimit(_node_pid(), resource.RLIMIT_NOFILE, (hard, hard))


Body = Callable[[Any, "Probe", dict[str, Any]], tuple[dict[str, Any], list[dict[str, Any]]]]


def _on_node(attack: Attack, transport: str, setting: Setting, body: Body) -> dict[str, Any]:
    """One attack on a fresh node: `body(node, probe, before)` attacks it and returns the attacker's
    outcome and its own checks; around it, the node's report before and after, the run's own SHUTDOWN
    (refused or unanswered: a failure), and the checks every row has (no honest peer refused, the
    longest honest round trip or handshake, the node's memory growth)."""
    import numpy as np

    from rlbench.kit.access import replay_node

    probe = Probe()
    after: dict[str, Any] = {}
    alive = shutting_down = False
    try:
        with contextlib.ExitStack() as stack:
            soft, hard = attack.node_descriptors or (None, None)
            with _soft_descriptor_limit(soft):
                node = stack.enter_context(replay_node(
                    transport, transport_options=setting.options, rate_limit=attack.rate_limit, capacity=1 << 16,
                    layout=_cartpole_layout(), timeout=setting.honest_timeout_s))
            if hard is not None:
                _cap_node_descriptors(hard)
            before = node.report()
            outcome, checks = body(node, probe, before)
            after = _stats(node, probe, "after the attack") or {}
            alive = bool(after)
            shutting_down = True
    except Exception as exc:
        if not shutting_down:
            raise
        probe.failures.append(f"the run's SHUTDOWN: {type(exc).__name__}: {exc}")
    times = probe.round_trips_ms
    nan = float("nan")
    growth = (after["max_rss_bytes"] - before["max_rss_bytes"]) / (1 << 20) if alive else nan
    longest = max(times + probe.handshakes_ms, default=nan)
    checks = [check("honest requests refused or unanswered", len(probe.failures), 0, ""),
              check("longest honest round trip or handshake", longest, STALL_TARGET_MS, "ms", timing=True),
              check("node memory growth", growth, GROWTH_TARGET_MIB, "MiB"), *checks]
    if attack.judge is not None and alive:
        checks += attack.judge(outcome, before, after)
    return {"attack": attack.name, "transport": transport, "what": attack.what,
            "honest_round_trips": len(probe.round_trips_ms),
            "p50_ms": float(np.percentile(times, 50)) if times else nan,
            "p99_ms": float(np.percentile(times, 99)) if times else nan, "longest_ms": longest,
            "handshake_p50_ms": float(np.median(probe.handshakes_ms)) if probe.handshakes_ms else nan,
            "round_trip_longest_ms": max(times, default=nan),
            "node_growth_mib": growth, "node_alive": alive, "node_counted": _counters_moved(before, after),
            "attacker": outcome, "failures": probe.failures, "honest_timeouts": probe.timeouts, "checks": checks}


def target_for(attack: Attack, transport: str, setting: Setting, node: Any, **more: Any) -> Target:
    """All the attacker's process is handed: never the node's secret (kit.access's `node.secret`)."""
    return Target(attack.name, transport, node.address, attacker_key(attack, node.secret), setting, **more)


def run_attack(attack: Attack, transport: str, options: dict[str, Any], seconds: float,
               timeout: float = HONEST_TIMEOUT_S) -> dict[str, Any]:
    """The row of `attack` over `transport` at the default sizes, for `seconds`; `timeout`: how long
    the honest actor waits for one answer before it counts a failure (over an unreliable transport,
    before it sends the request again)."""
    setting = replace(DEFAULT_SETTING, seconds=seconds, honest_timeout_s=timeout,
                      transport_options=tuple(sorted(options.items())))
    return attack.run(attack, transport, setting)


def concurrent(attack: Attack, transport: str, setting: Setting) -> dict[str, Any]:
    """The attacker works for `seconds` while the honest actor keeps doing round trips."""
    def body(node: Any, probe: Probe, before: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        with _Attacker(attack, target_for(attack, transport, setting, node)) as attacker:
            honest = _honest(node, transport, setting, attack.honest_inserts)
            probe.round_trips_ms, probe.handshakes_ms = honest.round_trips_ms, honest.handshakes_ms
            probe.failures += honest.failures
            probe.timeouts += honest.timeouts
            return attacker.outcome(setting.seconds + 60), []

    return _on_node(attack, transport, setting, body)


def strangers_then_honest(attack: Attack, transport: str, setting: Setting) -> dict[str, Any]:
    """The honest actor and the launcher authenticate; the strangers come; then both must be answered
    on the connections they had (an INSERT, STATS, the run's SHUTDOWN)."""
    def body(node: Any, probe: Probe, before: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        channel = _honest_channel(node, transport, setting, probe)
        try:
            _round_trips(channel, probe, 1, True)
            with _Attacker(attack, target_for(attack, transport, setting, node)) as attacker:
                outcome = attacker.outcome(60)
                _round_trips(channel, probe, 20, True)
        finally:
            _close(channel, probe)
        return outcome, []

    return _on_node(attack, transport, setting, body)


def _stats(node: Any, probe: Probe, when: str) -> dict[str, Any] | None:
    """The node's report, or None with the launcher's failure to get it recorded."""
    try:
        return node.report()
    except Exception as exc:
        probe.failures.append(f"the launcher's STATS {when}: {type(exc).__name__}: {exc}")
        return None


def idle_strangers(attack: Attack, transport: str, setting: Setting) -> dict[str, Any]:
    """Idle stranger connections on a node started under `node_descriptors`: its CPU while only they
    are connected, and a new honest peer's handshake meanwhile."""
    def body(node: Any, probe: Probe, before: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        pid = _node_pid()
        with _Attacker(attack, target_for(attack, transport, setting, node)) as attacker:
            outcome = attacker.outcome(setting.strangers * 0.1 + 60)
            time.sleep(0.2)
            cpu_before, started = _cpu_s(pid), time.perf_counter()
            time.sleep(setting.idle_window_s)
            cpu = (_cpu_s(pid) - cpu_before) / (time.perf_counter() - started)
            second = _stats(node, probe, "with only strangers connected")
            try:
                channel = _honest_channel(node, transport, setting, probe)
            except Exception as exc:
                probe.failures.append(f"honest HELLO: {type(exc).__name__}: {exc}")
            else:
                _round_trips(channel, probe, 20, True)
                _close(channel, probe)
        limit = (second or {}).get("descriptors")  # the node's: soft at start, soft raised, hard
        outcome["node's descriptors at start"] = \
            f"soft {limit['soft_before']} -> {limit['soft']} (hard {limit['hard']})" if limit else "not reported"
        if attack.node_descriptors and attack.node_descriptors[1] is not None:
            outcome["then capped at"] = attack.node_descriptors[1]
        return outcome, [check("node CPU with only idle strangers", cpu, IDLE_CPU_TARGET, "s/s")]

    return _on_node(attack, transport, setting, body)


def _peak_waiting(report: dict[str, Any]) -> float:
    """The most SAMPLEs the node has held waiting at once (nan where its report does not say)."""
    return float(report.get("queue_depths", {}).get("pending_samples", {}).get("max", float("nan")))


def mass_disconnects(attack: Attack, transport: str, setting: Setting) -> dict[str, Any]:
    """`identities` learner connections (each proving its own key) with SAMPLEs waiting: an honest
    STATUS round trip with nothing waiting and with all of them waiting (the node's step is inside
    it), then all gone at once: the longest honest round trip while the node forgets them."""
    import numpy as np

    from rlbench.runtime.distributed import messages
    from rlbench.runtime.distributed.replay_node import FORGET_EVERY_S

    def body(node: Any, probe: Probe, before: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        keys = tuple(messages.role_key(node.secret, "learner", index) for index in range(1, setting.identities + 1))
        channel = _honest_channel(node, transport, setting, probe)
        try:
            quiet = Probe()
            _round_trips(channel, quiet, 200, False)
            with _Attacker(attack, target_for(attack, transport, setting, node, keys=keys)) as attacker:
                outcome = attacker.outcome(setting.build_s + 120)
                loaded = Probe()
                _round_trips(channel, loaded, 200, False)
                waiting = _peak_waiting(_stats(node, loaded, "with the load waiting") or {})
                gone = Probe()
                closed = attacker.closed()
                baseline = before["peers"] + 1  # the honest actor's connection
                forgetting_until = time.monotonic() + 5.0 + 2 * FORGET_EVERY_S
                unanswered_ms = 0.0  # the longest the node left a request (answered or not) while it forgot
                closed_at, forgotten_s = time.monotonic(), float("nan")
                longest_honest_ms = longest_stats_ms = 0.0
                while time.monotonic() < forgetting_until:
                    started = time.perf_counter()
                    answered = _round_trips(channel, gone, 1, False)
                    honest_ms, started = (time.perf_counter() - started) * 1e3, time.perf_counter()
                    stats = _stats(node, gone, "while the departed are forgotten") if answered else None
                    stats_ms = (time.perf_counter() - started) * 1e3
                    longest_honest_ms, longest_stats_ms = max(longest_honest_ms, honest_ms), max(longest_stats_ms, stats_ms)
                    unanswered_ms = max(unanswered_ms, honest_ms, stats_ms)
                    if stats is not None and stats["peers"] <= baseline:
                        forgotten_s = time.monotonic() - closed_at
                        break
                    if stats is None:
                        break
            for part in (quiet, loaded, gone):
                probe.failures += part.failures
            probe.round_trips_ms += quiet.round_trips_ms + loaded.round_trips_ms  # (forgetting has its own target)
        finally:
            _close(channel, probe)
        quiet_ms = float(np.median(quiet.round_trips_ms)) if quiet.round_trips_ms else float("nan")
        step_ms = float(np.median(loaded.round_trips_ms)) if loaded.round_trips_ms else float("nan")
        # (unmeasured unless the node was seen to forget them all, or failed to answer meanwhile)
        forgetting_ms = unanswered_ms if forgotten_s == forgotten_s or gone.failures else float("nan")
        outcome.update({"STATUS p50 with nothing waiting ms": round(quiet_ms, 3), "closed all": closed,
                        "peak waiting SAMPLEs": waiting, "all forgotten after s": round(forgotten_s, 2),
                        "longest honest STATUS ms": round(longest_honest_ms, 2),
                        "longest launcher STATS ms": round(longest_stats_ms, 2)})
        shown = "an unreported number of" if waiting != waiting else f"{waiting:,.0f}"
        return outcome, [
            check(f"STATUS round trip (the node's step in it) with {shown} waiting", step_ms, STEP_TARGET_MS,
                  "ms", timing=True),
            check(f"longest honest round trip while {outcome.get('connections', 0):,} peers are forgotten",
                  forgetting_ms, STALL_TARGET_MS, "ms", timing=True),
            check(f"all {outcome.get('connections', 0):,} forgotten after", forgotten_s, FORGET_TARGET_S, "s",
                  timing=True),
            check(f"waiting SAMPLEs the load could not place in {setting.build_s:g} s",
                  setting.identities * setting.waiting_each - waiting, 0, "", timing=True)]

    return _on_node(attack, transport, setting, body)


def spoofed_datagram(attack: Attack, transport: str, setting: Setting) -> dict[str, Any]:
    """The honest actor authenticates over udp and INSERTs; an attacker on the path sends an INSERT
    from its address and port; the node must not store it as the actor's, and the actor's next
    requests must still be answered. Where the transport says it trusts the network path (it refuses
    to listen off loopback unless told to trust it, checked here), what the injection does is that
    design's stated cost: `trusted network path by design`, not open."""
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed import messages

    def body(node: Any, probe: Probe, before: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        channel = _honest_channel(node, transport, setting, probe)
        after_injection = Probe()
        try:
            _round_trips(channel, probe, 1, True)
            seen = {"source": channel.connection._sock.getsockname(), "next_seq": channel.connection._server.send_seq}
            with _Attacker(attack, target_for(attack, transport, setting, node, seen=seen)) as attacker:
                outcome = attacker.outcome(60)
                time.sleep(0.2)
                stored = node.report()["stored_by"].get(messages.role_name("actor", HONEST_INDEX), 0)
            _round_trips(channel, after_injection, 5, True)
            probe.failures += after_injection.failures
        finally:
            _close(channel, probe)
        by_design = _refuses_off_loopback(get_registry().get("transport", transport).create(**setting.options))
        outcome["off loopback without trust"] = "refused" if by_design else "listens"
        excuse = "trusted network path by design" if by_design else ""
        return outcome, [
            check("rows stored in the honest actor's name that it never sent", stored - 4, 0, "", excused=excuse),
            check("longest honest round trip after the injection", max(after_injection.round_trips_ms, default=0.0),
                  STALL_TARGET_MS, "ms", timing=True, excused=excuse)]

    return _on_node(attack, transport, setting, body)


def _refuses_off_loopback(transport: Any) -> bool:
    """Whether the transport refuses to listen where other hosts reach it unless told to trust the path."""
    listen_address = getattr(transport, "listen_address", None)
    if listen_address is None:
        return False
    try:
        listen_address("192.0.2.1")  # TEST-NET-1: off loopback, never this host's
    except Exception:
        return True
    return False


def _lost_bounded(outcome: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """`lost` may grow by what the peer sent, and by one window of UDP_MAX_GAP in the listener's life
    (udp's docstring): never by a window per datagram."""
    added = after.get("link", {}).get("lost", 0) - before.get("link", {}).get("lost", 0)
    return [check("udp `lost` added (the datagrams sent + one window)", added,
                  outcome.get("datagrams", 0) + UDP_MAX_GAP, "")]


def _waiting_per_identity(outcome: dict[str, Any], before: dict[str, Any],
                          after: dict[str, Any]) -> list[dict[str, Any]]:
    limit = after.get("limits", {}).get("max_waiting_samples", 4)
    return [check("SAMPLEs one learner key kept waiting (peak)", _peak_waiting(after), limit, "")]


ATTACKS = (
    Attack("retried-inserts", "an actor retries one INSERT (one request id) 20k times (issue #21: none_dealloc)",
           concurrent, _attack),
    Attack("refused-inserts", "an actor sends 20k INSERTs refused for their dtype", concurrent, _attack),
    Attack("slow-reader", "an authenticated actor floods STATUS and never reads a reply", concurrent, _attack),
    Attack("stranger-flood", "a peer without the secret floods STATUS and never reads, reconnecting when dropped",
           concurrent, _attack, compromised=None),
    Attack("waiting-samples", "the learner sends SAMPLEs the node cannot serve yet, without reading",
           concurrent, _attack, compromised=("learner", 0), rate_limit=(1.0, 10 ** 9, 1e18)),
    Attack("held-inserts", "an actor pipelines INSERTs the rate limiter holds, without reading",
           concurrent, _attack, rate_limit=(1.0, 1, 0.0), honest_inserts=False),
    Attack("short-connections", "20k short connections of a stranger (connect, STATUS, close)",
           concurrent, _attack, compromised=None),
    Attack("layout-poison", "a hostile actor's first INSERT is (8, 7) float64, then honest CartPole INSERTs",
           concurrent, _attack),
    Attack("impersonation", "an actor authenticates as the launcher and the learner, and sends SHUTDOWN",
           concurrent, _attack),
    Attack("produced-claim", "an INSERT of 4 transitions claims produced = 2**53", concurrent, _attack),
    Attack("sequence-jump", "a udp stranger jumps its sequence numbers by 2**30", concurrent, _attack,
           compromised=None, transports=("udp",)),
    Attack("udp-strangers", "1,100 stranger sockets send one udp HELLO each; then the honest actor's INSERT and "
           "the launcher's STATS and SHUTDOWN on their connections (issue #40 item 1)",
           strangers_then_honest, _udp_strangers, compromised=None, transports=("udp",)),
    Attack("idle-strangers", "1,100 tcp connections that never send, to a node started at the common soft limit "
           "of 1,024 descriptors; its CPU meanwhile and a new honest peer's HELLO (issue #40 item 2)",
           idle_strangers, _idle_connections, compromised=None, transports=("tcp",),
           node_descriptors=(COMMON_DESCRIPTOR_LIMIT, None)),
    Attack("no-descriptors", "the same, with 1,024 descriptors as the hard limit too: the node runs out (EMFILE) "
           "and must shed strangers, not spin (issue #40 item 2)",
           idle_strangers, _idle_connections, compromised=None, transports=("tcp",),
           node_descriptors=(COMMON_DESCRIPTOR_LIMIT, COMMON_DESCRIPTOR_LIMIT)),
    Attack("lost-inflation", "an authenticated udp actor jumps its sequence by 65,536 on each of 40,000 datagrams "
           "(issue #40 item 3)", concurrent, _lost_inflation, transports=("udp",), judge=_lost_bounded),
    Attack("identity-takeover", "one learner key re-authenticates over and over, each connection leaving SAMPLEs "
           "waiting (issue #40 item 4)", concurrent, _identity_takeover, compromised=("learner", 0),
           rate_limit=(1.0, 10 ** 9, 1e18), judge=_waiting_per_identity),
    Attack("mass-disconnects", "12,500 learner connections, 4 SAMPLEs waiting on each (50k), then all gone at "
           "once (issue #40 item 4)", mass_disconnects, _many_learners, compromised=None,
           rate_limit=(1.0, 10 ** 9, 1e18), transports=("tcp",)),
    Attack("datagram-injection", "an on-path attacker sends an INSERT from the honest udp actor's address and "
           "port, with its next sequence number (issue #40 item 5)", spoofed_datagram, _spoofed_insert,
           compromised=None, transports=("udp",)),
)
ATTACK_NAMES = tuple(attack.name for attack in ATTACKS)


# ------------------------------------------------------------------------------------------ run
def failed_row(attack: Attack, transport: str, exc: BaseException) -> dict[str, Any]:
    """A row that raised: the exception and where (a bare queue.Empty says little by itself)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/rlbench/', 1)[-1]}:{frames[-1].lineno} in {frames[-1].name})" \
        if frames else ""
    return {"attack": attack.name, "transport": transport, "what": attack.what, "checks": [],
            "failed": f"{type(exc).__name__}: {exc}{where}" if str(exc) else f"{type(exc).__name__}{where}"}


def run_rows(attacks: Any, transports: Any, setting: Setting,
             emit: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Each attack over each transport it applies to, each row handed to `emit` as it completes (with
    its verdict and the machine's state meanwhile); a row that raises becomes a `failed` row."""
    from rlbench.machine_state import watch

    rows = []
    for transport in transports:
        for attack in attacks:
            if attack.transports and transport not in attack.transports:
                continue
            with watch(busy_processes=3) as machine:  # the node, the attacker, the honest actor
                try:
                    row = attack.run(attack, transport, setting)
                except Exception as exc:  # this row's failure, not the table's
                    row = failed_row(attack, transport, exc)
            row["machine"] = machine.report()
            row["verdict"] = "failed" if "failed" in row else verdict(row["checks"], _contended(row["machine"]))
            emit(row)
            rows.append(row)
    return rows


def _figure(value: float, unit: str) -> str:
    if value != value:
        return "none"
    text = f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def header(setting: Setting) -> str:
    return (f"replay node under attack (issues #21, #40): each row's figures beside their targets, held or open; "
            f"all measured\n  (a timing that misses while other processes used the machine: contended, not judged; "
            f"{setting.seconds:g} s per concurrent attack)")


def format_row(row: dict[str, Any]) -> str:
    lines = [f"  {row['transport']:<4} {row['attack']:<19} {row['verdict']}"]
    if "failed" in row:
        lines.append(f"       failed: {row['failed']}")
        return "\n".join(lines)
    if row["verdict"] == "contended, not judged":
        machine = row["machine"]
        lines[0] += (f" (other processes used {machine.get('other_processes_cores') or 0:.2f} core(s), "
                     f"{machine.get('steal_fraction') or 0:.0%} stolen)")
    if row.get("honest_round_trips"):
        lines.append(f"       honest round trips {row['honest_round_trips']:,}: p50 {row['p50_ms']:.2f} ms, "
                     f"p99 {row['p99_ms']:.2f} ms")
    for one in row["checks"]:
        mark = "ok " if one["held"] else "MISS (by design)" if one["excused"] else "MISS"
        lines.append(f"       {mark} {one['what']}: {_figure(one['figure'], one['unit'])} "
                     f"(target <= {_figure(one['target'], one['unit'])})")
    counted = ", ".join(f"{k}={v}" for k, v in sorted(row["node_counted"].items())) or "-"
    attacker = ", ".join(f"{k}={v}" for k, v in row["attacker"].items())
    lines.append(f"       node counted: {counted}; attacker: {attacker}")
    for failure in row["failures"]:
        lines.append(f"       honest peer: {failure}")
    return "\n".join(lines)


@click.command("attacks")
@click.option("--transport", "transports", multiple=True, default=DEFAULT_TRANSPORTS, show_default=True,
              help="transports to attack the node over (repeatable)")
@click.option("--attack", "attacks", multiple=True, type=click.Choice(ATTACK_NAMES),
              help="attacks to run (repeatable; default: all)")
@click.option("--seconds", default=2.0, show_default=True, type=click.FloatRange(min=0.1),
              help="how long each concurrent attack (and the honest actor's probing) lasts")
@click.option("--quick", is_flag=True, help="small attacks (tens of strangers and peers): checks the harness, "
              "not the targets")
@click.option("--json", "as_json", is_flag=True, help="print each row as a JSON line as it completes")
def command(transports: tuple[str, ...], attacks: tuple[str, ...], seconds: float, quick: bool,
            as_json: bool) -> None:
    """The replay node under each attack of issues #21 and #40 (crash, stall, flood, exhaustion,
    eviction, poison, impersonation, injection): its figures beside their targets, held or open."""
    from rlbench.plugins import get_registry

    for transport in transports:
        get_registry().get("transport", transport)  # unknown names: did you mean
    setting = QUICK if quick else replace(DEFAULT_SETTING, seconds=seconds)
    chosen = [attack for attack in ATTACKS if not attacks or attack.name in attacks]
    if not as_json:
        click.echo(header(setting))

    def emit(row: dict[str, Any]) -> None:
        click.echo(json.dumps(row, default=str) if as_json else format_row(row))

    rows = run_rows(chosen, transports, setting, emit)
    if not as_json:
        verdicts = [row["verdict"] for row in rows]
        click.echo(f"  {len(rows)} rows: " + ", ".join(f"{verdicts.count(name)} {name}"
                                                      for name in dict.fromkeys(verdicts)))
