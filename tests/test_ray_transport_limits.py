"""The `ray` transport's listener and a slow peer (issue #21 item 2): its send never waits on the
peer, and what its inbox holds for one peer is bounded (`max_queued_bytes`). A peer that never takes
what it is sent is dropped by the inbox, which tells the listener with an event its next recv takes;
the listener's next send to that peer raises SlowConsumerError, and an honest peer is served all
along. One Ray cluster for the module (ray_support.local_cluster), taken down at its end."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ray_support import local_cluster, ray_unavailable
from rlbench.errors import RlbenchError
from rlbench.kit.framing import MAX_QUEUED_BYTES, SlowConsumerError, TransportClosedError

pytestmark = pytest.mark.skipif(ray_unavailable() is not None, reason=str(ray_unavailable()))

PROMPT_S = 0.5  # generous: a send is one actor call nobody waits for
MESSAGE = 64 << 10
BOUND = 1 << 20  # the inbox's bound per peer in these tests (MAX_QUEUED_BYTES by default)
WAIT_S = 20  # for anything that crosses Ray


@pytest.fixture(scope="module")
def cluster():
    with local_cluster() as started:
        yield started


@pytest.fixture
def transport(cluster):
    """A RayTransport factory; after the test, no inbox is left running."""
    import ray

    from rlbench.builtin.transports.ray_actors import NAMESPACE, RayTransport

    yield RayTransport
    deadline = time.monotonic() + 15
    while True:
        left = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]
        if not left:
            return
        assert time.monotonic() < deadline, f"inboxes left running: {left}"
        time.sleep(0.2)


def promptly(call, *args):
    """Run `call(*args)` and return what it returns, failing when it takes over PROMPT_S (in a thread,
    so that a call that waits on its peer fails the test instead of hanging it)."""
    outcome = {}

    def run():
        started = time.monotonic()
        try:
            outcome["value"] = call(*args)
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc
        outcome["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(PROMPT_S * 10)
    assert not thread.is_alive(), f"{call.__name__} still waits after {PROMPT_S * 10} s"
    assert outcome["took"] < PROMPT_S, f"{call.__name__} took {outcome['took']:.3f} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def payload(i: int) -> bytes:
    return i.to_bytes(4, "little") + np.random.default_rng(i).bytes(MESSAGE - 4)


def hello(listener, connection, text: bytes) -> int:
    connection.send(text)
    item = listener.recv(timeout=WAIT_S)
    assert item is not None and bytes(item[1]) == text
    return item[0]


def round_trip(listener, honest, honest_peer: int, i: int) -> None:
    honest.send(b"ping %d" % i)
    item = listener.recv(timeout=WAIT_S)
    assert item is not None, f"round trip {i}: the honest peer's message did not arrive"
    assert item[0] == honest_peer and bytes(item[1]) == b"ping %d" % i
    promptly(listener.send, honest_peer, b"pong %d" % i)
    reply = honest.recv(timeout=WAIT_S)
    assert reply is not None and bytes(reply) == b"pong %d" % i


def test_a_peer_that_never_takes_is_dropped_while_an_honest_peer_is_served(transport):
    listener = transport(max_queued_bytes=BOUND).listen()
    slow = honest = None
    try:
        slow = transport().connect(listener.address, timeout=WAIT_S)
        honest = transport().connect(listener.address, timeout=WAIT_S)
        slow_peer = hello(listener, slow, b"hello, I will never read")
        honest_peer = hello(listener, honest, b"hello")
        dropped_at = None
        for i in range(100):  # 6.4 MiB: far more than the bound
            try:
                promptly(listener.send, slow_peer, payload(i))
            except SlowConsumerError as exc:
                assert "max_queued_bytes" in str(exc)
                dropped_at = i
                break
            round_trip(listener, honest, honest_peer, i)  # its recv takes the inbox's news
        assert dropped_at is not None, "100 messages of 64 KiB to a peer that never takes them, and it was not dropped"
        # the send that overflowed the bound, or the next one (the listener learns of it at its next recv)
        assert BOUND // MESSAGE - 1 <= dropped_at <= BOUND // MESSAGE + 1, f"dropped at message {dropped_at}"
        stats = listener.stats
        assert stats["slow_consumers"] == 1 and stats["dropped_peers"] == 1, stats
        assert listener.peers == [honest_peer]
        with pytest.raises(TransportClosedError):
            listener.send(slow_peer, b"more")
        round_trip(listener, honest, honest_peer, 1000)
        with pytest.raises(TransportClosedError, match="dropped"):  # what waited for it is forgotten
            slow.recv(timeout=WAIT_S)
    finally:
        for connection in (slow, honest):
            if connection is not None:
                connection.close()
        listener.close()


def test_a_listener_that_only_sends_learns_of_the_drop_within_its_pacing(transport):
    from rlbench.builtin.transports.ray_actors import _IN_FLIGHT

    listener = transport(max_queued_bytes=BOUND).listen()
    slow = None
    try:
        slow = transport().connect(listener.address, timeout=WAIT_S)
        slow_peer = hello(listener, slow, b"hello, I will never read")
        dropped_at = None
        for i in range(BOUND // MESSAGE + _IN_FLIGHT + 8):  # no recv: the reply's own result tells
            try:
                promptly(listener.send, slow_peer, payload(i))
            except SlowConsumerError:
                dropped_at = i
                break
        assert dropped_at is not None, "a listener that only sends never learned that its slow peer was dropped"
        assert listener.stats["slow_consumers"] == 1 and listener.peers == []
    finally:
        if slow is not None:
            slow.close()
        listener.close()


def test_a_late_reader_gets_every_message_in_order_while_the_listener_goes_on(transport):
    listener = transport(max_queued_bytes=4 << 20).listen()
    late = None
    got: list[bytes] = []
    count = 48  # 3 MiB, within the bound
    try:
        late = transport().connect(listener.address, timeout=WAIT_S)
        peer = hello(listener, late, b"hello, I will read later")
        for i in range(count):
            promptly(listener.send, peer, payload(i))

        def drain():
            while len(got) < count:
                message = late.recv(timeout=WAIT_S)
                if message is None:
                    return
                got.append(bytes(message))

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        deadline = time.monotonic() + 2 * WAIT_S
        while reader.is_alive() and time.monotonic() < deadline:
            assert listener.recv(timeout=0.05) is None  # the listener's loop goes on meanwhile
        reader.join(1)
        assert len(got) == count, f"{len(got)} of {count} messages arrived"
        for i, message in enumerate(got):
            assert message == payload(i), f"message {i} arrived out of order or corrupted"
        assert listener.stats["slow_consumers"] == 0 and listener.peers == [peer]
    finally:
        if late is not None:
            late.close()
        listener.close()


def test_max_queued_bytes_is_a_positive_number_of_bytes():
    from rlbench.builtin.transports.ray_actors import RayTransport

    assert RayTransport().max_queued_bytes == MAX_QUEUED_BYTES
    assert RayTransport(max_queued_bytes=4096).max_queued_bytes == 4096
    for bad in (0, -1, "lots"):
        with pytest.raises(RlbenchError, match="max_queued_bytes"):
            RayTransport(max_queued_bytes=bad)
