"""Admission (issue #40, items 1 and 2): peers that have not authenticated are strangers, kept apart
from the run's roles as a SYN queue is kept apart from established connections. Strangers are
bounded in number and in time, never displace an authenticated peer, and a node out of descriptors
neither spins nor stops answering an honest role. Each test fails on the transports and the node
before these rules (small counts show what the issue's 1,100 strangers did)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from support import SECRET, served, valid_insert
from rlbench.builtin.transports import shm
from rlbench.builtin.transports.tcp import TcpTransport
from rlbench.builtin.transports.udp import UdpTransport
from rlbench.errors import RlbenchError
from rlbench.kit.framing import Strangers
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.channel import Channel
from rlbench.runtime.distributed.messages import Op, role_key
from rlbench.testing.transport import check_transport

UDP_HEADER = struct.Struct("<HBBIIIII")  # magic, version, kind, seq, index, count, total, fragment
UDP_HELLO = UDP_HEADER.pack(0x5242, 1, 2, 0, 0, 0, 0, 0)
ROOT = Path(__file__).resolve().parents[1]
needs_shm = pytest.mark.skipif(not shm.probe().available, reason=f"shm unavailable: {shm.probe().reason}")


def host_port(address: str) -> tuple[str, int]:
    host, port = address.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def drive(listener, seconds: float) -> list[tuple[int, bytes]]:
    got = []
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        item = listener.recv(timeout=min(remaining, 0.02))
        if item is not None:
            got.append((item[0], bytes(item[1])))
    return got


def authenticated(transport, listener, role="actor", index=0) -> Channel:
    channel = Channel(transport.connect(listener.address), reliable=transport.capabilities.reliable, timeout=10)
    channel.authenticate(role, index, role_key(SECRET, role, index))
    return channel


# ------------------------------------------------------------------------- the listeners' rules
@pytest.mark.parametrize("factory", [TcpTransport, UdpTransport])
def test_admission_refuses_bad_values_in_one_line(factory):
    listener = factory().listen()
    try:
        for bad, named in (({"handshake_s": 0, "max_strangers": 4}, "handshake_s"),
                           ({"handshake_s": -1, "max_strangers": 4}, "handshake_s"),
                           ({"handshake_s": 1.0, "max_strangers": 0}, "max_strangers"),
                           ({"handshake_s": 1.0, "max_strangers": 2.5}, "max_strangers")):
            with pytest.raises(RlbenchError, match=named) as refused:
                listener.expect_admission(**bad)
            assert "\n" not in str(refused.value)
    finally:
        listener.close()


def test_udp_stranger_hellos_never_evict_an_admitted_peer():
    """Item 1 on the listener: 40 strangers' HELLOs on a listener that keeps 32 peers evicted the
    admitted one (the idlest); now strangers are shed among themselves."""
    listener = UdpTransport(max_peers=32).listen()
    listener.expect_admission(handshake_s=30, max_strangers=8)
    honest = UdpTransport().connect(listener.address)
    strangers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(40)]
    try:
        honest.send(b"hello")
        (peer, _), = drive(listener, 0.2)
        listener.admit(peer)
        for stranger in strangers:
            stranger.sendto(UDP_HELLO, host_port(listener.address))
            drive(listener, 0.002)
        drive(listener, 0.1)
        stats = listener.stats
        assert peer in listener.peers and len(listener.peers) == 1 + 8
        assert stats["strangers_shed"] == 40 - 8 and stats["evicted_peers"] == 0
        honest.send(b"still me")
        assert drive(listener, 0.2) == [(peer, b"still me")]  # the same peer: not re-joined under a new id
    finally:
        for stranger in strangers:
            stranger.close()
        honest.close()
        listener.close()


def test_udp_full_of_admitted_peers_turns_a_stranger_away_not_an_admitted_peer():
    listener = UdpTransport(max_peers=2).listen()
    listener.expect_admission(handshake_s=30, max_strangers=8)
    roles = [UdpTransport().connect(listener.address) for _ in range(2)]
    stranger = UdpTransport().connect(listener.address)
    try:
        for index, role in enumerate(roles):
            role.send(b"role %d" % index)
            (peer, _), = drive(listener, 0.2)
            listener.admit(peer)
        admitted = sorted(listener.peers)
        stranger.send(b"let me in")
        assert drive(listener, 0.2) == [] and sorted(listener.peers) == admitted
        assert listener.stats["strangers_shed"] >= 1
        with pytest.raises(ConnectionError):  # it was told: BYE
            stranger.recv(timeout=1.0)
    finally:
        for connection in (*roles, stranger):
            connection.close()
        listener.close()


def test_tcp_idle_strangers_shed_their_own_before_one_in_its_handshake():
    """At max_strangers, a newcomer sheds the oldest stranger that never sent a message: a flood of
    idle connections sheds itself, not a peer that has spoken (an honest one speaks at once)."""
    listener = TcpTransport().listen()
    listener.expect_admission(handshake_s=30, max_strangers=3)
    speaker = TcpTransport().connect(listener.address)
    idle = []
    try:
        speaker.send(b"HELLO, as a role would")
        (spoke, _), = drive(listener, 0.2)
        for _ in range(10):
            idle.append(socket.create_connection(host_port(listener.address)))
            drive(listener, 0.01)
        assert spoke in listener.peers and len(listener.peers) == 3
        assert listener.stats["strangers_shed"] == 10 - 2
        closed = 0
        for sock in idle:
            sock.settimeout(0.2)
            try:
                closed += sock.recv(1) == b""
            except socket.timeout:
                pass
        assert closed == 10 - 2  # the shed ones see their connection end
    finally:
        for sock in idle:
            sock.close()
        speaker.close()
        listener.close()


class TcpAdmittingNobody(TcpTransport):
    """Declares admission, but its listener's expect_admission only checks its values."""

    def listen(self, address=None):
        listener = super().listen(address)
        listener.expect_admission = lambda handshake_s, max_strangers: Strangers().expect(handshake_s, max_strangers,
                                                                                           "tcp")
        return listener


class TcpUndeclared(TcpTransport):
    """Its listener keeps strangers apart, but its capabilities do not say so."""

    capabilities = dataclasses.replace(TcpTransport.capabilities, admission=False)


@pytest.mark.parametrize("transport, message", [
    (TcpAdmittingNobody(), "with max_strangers=2, an admitted peer"),
    (TcpUndeclared(), "do not say admission=True"),
])
def test_the_kit_checks_admission_where_it_is_declared_and_only_there(transport, message):
    with pytest.raises(AssertionError, match=message):
        check_transport(transport, cross_process=False, sizes=(0, 1), timeout=3.0)


# ---------------------------------------------------------------------------------- the node's
def test_udp_strangers_never_evict_an_authenticated_actor_nor_the_runs_shutdown():
    """Item 1: a transport HELLO from anyone, with no secret, made a peer, and past max_peers the one
    heard from longest ago was evicted: the honest actor's next INSERT re-joined under a new id and
    was refused "INSERT before authentication", and so was the launcher's SHUTDOWN."""
    with served("udp", transport_options={"max_peers": 32}) as (transport, listener, node):
        actor = authenticated(transport, listener)
        assert actor.request(Op.INSERT, valid_insert(4))[0] == Op.INSERTED
        strangers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(40)]
        try:
            for stranger in strangers:
                stranger.sendto(UDP_HELLO, host_port(listener.address))
            time.sleep(0.3)
            assert actor.request(Op.INSERT, valid_insert(4))[0] == Op.INSERTED
            assert listener.stats["strangers_shed"] >= 40 - 31 and listener.stats["evicted_peers"] == 0
        finally:
            for stranger in strangers:
                stranger.close()
        actor.close()
    # (leaving `served` sent SHUTDOWN over a new connection, a stranger until it authenticated)


@pytest.mark.parametrize("transport_name", ["tcp", "udp"])
def test_the_node_admits_authenticated_roles_and_closes_strangers_after_the_handshake_time(transport_name):
    with served(transport_name, handshake_s=0.3) as (transport, listener, node):
        actor = authenticated(transport, listener)
        silent = transport.connect(listener.address)  # says nothing (udp: its transport HELLO only)
        talker = Channel(transport.connect(listener.address), reliable=transport.capabilities.reliable, timeout=10)
        hello = {"role": messages.text("actor"), "index": np.int64(1), "nonce": np.zeros(messages.NONCE_BYTES, np.uint8)}
        assert talker.request(Op.HELLO, hello)[0] == Op.CHALLENGE  # and never AUTH
        time.sleep(0.8)
        assert actor.request(Op.INSERT, valid_insert(4))[0] == Op.INSERTED  # admitted: never timed out
        assert listener.stats["handshake_timeouts"] == 2
        with pytest.raises(ConnectionError):
            silent.recv(timeout=1.0)
        assert node.descriptors["soft"] == node.descriptors["hard"]  # raised at start-up
        for connection in (actor, silent, talker):
            connection.close()


# The node in a process whose descriptors run out: 32 at start (its hard limit 64, which it raises
# the soft limit to), and 100 idle stranger connections. "listener": a listener alone, not in
# admission mode, driven as the node drives it, in a process with every descriptor taken.
OUT_OF_DESCRIPTORS = textwrap.dedent("""
    import json, os, resource, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 64))
    from rlbench import get_registry
    from rlbench.runtime.distributed.rate_limiter import RateLimiter
    from rlbench.runtime.distributed.replay_node import NodeSettings, ReplayNode
    registry = get_registry()
    listener = registry.get("transport", sys.argv[2]).create().listen(None)
    if sys.argv[1] == "listener":
        time.sleep(0.2)  # (shm's accept thread opens its selector)
        taken = []
        try:
            while True:
                taken.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        print(listener.address, flush=True)
        until = time.monotonic() + float(sys.argv[3])
        while time.monotonic() < until:
            listener.recv(timeout=0.02)
        print(json.dumps({"link": listener.stats}), flush=True)
    else:
        memory = registry.get("replay", "uniform").create(capacity=100, alpha=0.6, seed=0)
        settings = NodeSettings(placement="server", total_steps=10**9, batch_size=4, secret=b"s" * 32)
        node = ReplayNode(listener, memory, RateLimiter(1.0, 1, 1e9), settings, prioritized=False)
        print(listener.address, flush=True)
        report = node.serve()
        print(json.dumps({"link": report["link"], "descriptors": report["descriptors"]}), flush=True)
""")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stranger(address: str) -> socket.socket:
    """A connection that never says anything (shm's: to its handshake socket, as a process would)."""
    if address.startswith("shm://"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(b"\0rlbench-shm/" + address[len("shm://"):].encode())
        return sock
    return socket.create_connection(host_port(address))


def out_of_descriptors(mode: str, transport: str, *args: str, strangers: int = 100):
    process = subprocess.Popen([sys.executable, "-c", OUT_OF_DESCRIPTORS, mode, transport, *args],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    address = process.stdout.readline().strip()
    assert address.startswith(f"{transport}://"), f"the process did not start ({address!r})"
    return process, address, [stranger(address) for _ in range(strangers)]


@pytest.mark.parametrize("transport", ["tcp", pytest.param("shm", marks=needs_shm)])
def test_listener_out_of_descriptors_pauses_accepting_instead_of_spinning(transport):
    """Item 2, the listener alone: accept failed with EMFILE, the connection stayed in the backlog,
    the listening socket stayed readable and the loop spun (0.92 CPU-s/s in the issue; shm's accept
    thread did the same)."""
    process, _, strangers = out_of_descriptors("listener", transport, "2", strangers=40)  # (shm's backlog: 64)
    try:
        time.sleep(0.3)
        before = cpu_seconds(process.pid)
        time.sleep(1.0)
        spent = cpu_seconds(process.pid) - before
        # spinning took 0.34-0.92 CPU-s/s; idle is ~0.01 (the issue's 0.05 target is bench attacks' to show:
        # here, a loaded CI machine's scheduling noise must not fail a test of whether the loop spins)
        assert spent < 0.15, f"{spent:.3f} CPU-s in 1 s with only idle connections"
        result = json.loads(process.communicate(timeout=10)[0])  # (and recv returned at its timeouts)
        assert result["link"]["accept_backoffs"] >= 5
    finally:
        process.kill()
        for sock in strangers:
            sock.close()


def test_node_out_of_descriptors_answers_an_honest_role_and_does_not_spin():
    """Item 2: 100 idle connections in a node with 64 descriptors; it must neither spin nor leave a
    new role's HELLO unanswered (it sheds the oldest stranger to take it), and it raised its soft
    descriptor limit to the hard one at start-up, reported."""
    process, address, strangers = out_of_descriptors("node", "tcp")
    try:
        time.sleep(0.5)  # it takes them in, shedding the oldest when out of descriptors
        before = cpu_seconds(process.pid)
        time.sleep(1.0)
        spent = cpu_seconds(process.pid) - before
        assert spent < 0.15, f"{spent:.3f} CPU-s in 1 s with only idle strangers"  # as above
        transport = TcpTransport()
        launcher = Channel(transport.connect(address, timeout=5), timeout=5)
        launcher.authenticate("launcher", 0, role_key(SECRET, "launcher", 0))
        for sock in strangers:  # (its report imports a module: a descriptor of its own)
            sock.close()
        time.sleep(0.2)
        assert launcher.request(Op.SHUTDOWN)[0] == Op.OK
        result = json.loads(process.communicate(timeout=30)[0])
        assert result["descriptors"] == {"soft_before": 32, "soft": 64, "hard": 64}
        assert result["link"]["strangers_shed"] >= 100 + 1 - 64
        launcher.close()
    finally:
        process.kill()
        for sock in strangers:
            sock.close()
