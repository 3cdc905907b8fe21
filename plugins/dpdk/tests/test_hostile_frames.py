"""A listener on the receiving end of memif peers that lie, break the protocol or stall: a message
over its max_message_bytes is refused from its first frame, before anything is allocated for it;
reassembly holds only the bytes that arrived; a peer that breaks the rules is dropped, told why, and
counted (stats: refused_oversize, malformed, dropped_peers) while an honest peer is still served.

The liars are raw memif peers (rlbench_dpdk.testing.RawMemifPeer): an interface asked for like any
peer's, whose frames the test writes itself with the shim's own header layout."""

from __future__ import annotations

import random
import time

import pytest

from rlbench.testing import still_serves
from rlbench_dpdk.native import library
from rlbench_dpdk.testing import RawMemifPeer
from rlbench_dpdk.transport import DpdkTransport

MiB = 1 << 20
FUZZ_CASES = 32  # about 2 s on a quiet machine; the first 6 are one of each kind, the rest drawn at random
# Ends a run on a machine so loaded that the cases would take minutes; never reached otherwise, and
# no assertion of speed: the checks below hold for however many cases ran.
FUZZ_CAP_S = 60.0
ANSWER_TIMEOUT_S = 10.0  # how long an honest peer waits for its answer after a hostile one


@pytest.fixture(scope="module")
def wire(dpdk_available):
    """The shim's frame kinds, flags and goodbye reasons (rlb_dpdk.h)."""
    return library()[1]


def memory() -> tuple[int, int]:
    """(virtual, resident) bytes of this process: a buffer sized on a sender's claim shows in the first
    even before anything is written to it."""
    with open("/proc/self/statm") as statm:
        size, resident = (int(field) for field in statm.read().split()[:2])
    page = 4096
    return size * page, resident * page


def drain(listener, seconds: float) -> list[bytes]:
    """What the listener delivers within `seconds` (it reads, refuses and drops meanwhile)."""
    got = []
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        item = listener.recv(timeout=min(remaining, 0.02))
        if item is not None:
            got.append(bytes(item[1]))
    return got


def goodbyes(raw: RawMemifPeer, listener, wire, seconds: float = 1.0) -> list[int]:
    """The reasons of the goodbyes `raw` received within `seconds`, the listener running meanwhile."""
    reasons = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not reasons:
        drain(listener, 0.02)
        reasons += [reason for kind, reason in raw.receive() if kind == wire.K_BYE]
    return reasons


@pytest.fixture
def honest_pair(dpdk_available):
    def make(**options):
        listener = DpdkTransport(**options).listen()
        connection = DpdkTransport().connect(listener.address, timeout=10)
        still_serves(listener, connection, b"warm-up", timeout=ANSWER_TIMEOUT_S)
        pairs.append((listener, connection))
        return listener, connection

    pairs = []
    yield make
    for listener, connection in pairs:
        connection.close()
        listener.close()


def raw_peer(listener, wire) -> RawMemifPeer:
    raw = RawMemifPeer(listener.address)
    raw.send(raw.frame(wire.K_HELLO))
    drain(listener, 0.02)
    return raw


def test_a_claim_over_the_limit_is_refused_from_its_first_frame_and_the_peer_dropped(honest_pair, wire):
    listener, honest = honest_pair(max_message_bytes=MiB)
    raw = raw_peer(listener, wire)
    try:
        virtual, resident = memory()
        raw.send(raw.frame(wire.K_DATA, fseq=0, msg_len=0xFFFFFFFF, payload=bytes(100)))
        assert goodbyes(raw, listener, wire) == [wire.C_OVERSIZE]
        still_serves(listener, honest, timeout=ANSWER_TIMEOUT_S)
        grown_virtual, grown_resident = (after - before for after, before in zip(memory(), (virtual, resident)))
        assert grown_virtual < 16 * MiB and grown_resident < 16 * MiB, (grown_virtual, grown_resident)
        stats = listener.stats
        assert stats["refused_oversize"] == 1 and stats["dropped_peers"] == 1 and stats["messages_received"] == 2
        assert len(listener.peers) == 1
    finally:
        raw.close()


def test_a_claim_within_the_limit_holds_only_what_arrived(honest_pair, wire):
    """60 MiB claimed, 8 KB sent by each of several peers: memory follows the bytes, not the claims."""
    listener, honest = honest_pair()  # 64 MiB limit
    raws = [raw_peer(listener, wire) for _ in range(8)]
    try:
        virtual, resident = memory()
        for raw in raws:
            raw.send(raw.frame(wire.K_DATA, fseq=0, msg_len=60 * MiB, payload=bytes(8000)))
        drain(listener, 0.2)
        still_serves(listener, honest, timeout=ANSWER_TIMEOUT_S)
        grown_virtual = memory()[0] - virtual
        assert grown_virtual < 32 * MiB, f"8 claims of 60 MiB with 8 kB sent each grew the listener by {grown_virtual / MiB:.0f} MiB"
        assert listener.stats["refused_oversize"] == 0 and len(listener.peers) == 9  # slow, not dropped
    finally:
        for raw in raws:
            raw.close()


def test_a_peer_that_goes_quiet_mid_message_is_dropped_after_give_up(honest_pair, wire):
    listener, honest = honest_pair(give_up_s=0.3)
    raw = raw_peer(listener, wire)
    try:
        raw.send(raw.frame(wire.K_DATA, fseq=0, msg_len=100_000, payload=bytes(8000)))
        assert goodbyes(raw, listener, wire, seconds=3.0) == [wire.C_STALLED]
        still_serves(listener, honest, timeout=ANSWER_TIMEOUT_S)
        assert listener.stats["dropped_peers"] == 1 and len(listener.peers) == 1
    finally:
        raw.close()


def test_a_peer_that_asks_for_an_interface_and_never_says_hello_loses_it(honest_pair, wire):
    listener, honest = honest_pair(give_up_s=0.3)
    raw = RawMemifPeer(listener.address)  # no hello
    try:
        deadline = time.monotonic() + 10  # its port lingers 5 s: it keeps its end of the link up
        while listener.stats["dropped_peers"] == 0 and time.monotonic() < deadline:
            drain(listener, 0.05)
        assert listener.stats["dropped_peers"] == 1
        while raw.link_up() and time.monotonic() < deadline:  # its port is closed after it lingered
            drain(listener, 0.05)
        assert not raw.link_up(), "the listener kept the interface of a peer that never said hello"
        still_serves(listener, honest, timeout=ANSWER_TIMEOUT_S)
    finally:
        raw.close()


def data(raw: RawMemifPeer, wire, **fields) -> bytes:
    return raw.frame(wire.K_DATA, **fields)


# One frame per rule of the protocol, each sent by a peer that said hello.
MALFORMED = {
    "shorter than a header": lambda raw, wire: data(raw, wire, msg_len=10, payload=bytes(10))[:60],
    "wrong magic": lambda raw, wire: (lambda f: f[:42] + b"\x00\x00" + f[44:])(data(raw, wire, msg_len=1, payload=b"x")),
    "wrong version": lambda raw, wire: (lambda f: f[:44] + b"\x09" + f[45:])(data(raw, wire, msg_len=1, payload=b"x")),
    "IP header with options": lambda raw, wire: (lambda f: f[:14] + b"\x46" + f[15:])(data(raw, wire, msg_len=1, payload=b"x")),
    "unknown kind": lambda raw, wire: raw.frame(9),
    "unknown flag": lambda raw, wire: data(raw, wire, flags=wire.F_TO_LISTENER | 0x40, msg_len=1, payload=b"x"),
    "fragment before its message began": lambda raw, wire: data(raw, wire, msg_len=100, offset=50, payload=bytes(50)),
    "claims more bytes than it carries": lambda raw, wire: data(raw, wire, msg_len=9000, frag_len=8000, payload=bytes(10)),
    "runs past its message": lambda raw, wire: data(raw, wire, msg_len=10, payload=bytes(20)),
    "empty fragment of a message": lambda raw, wire: data(raw, wire, msg_len=10),
    "another connection on this interface": lambda raw, wire: data(raw, wire, conn=raw.conn ^ 0xFFFF, msg_len=1, payload=b"x"),
    "a welcome sent to the listener": lambda raw, wire: raw.frame(wire.K_WELCOME),
    "a frame meant for a client": lambda raw, wire: data(raw, wire, flags=0, msg_len=1, payload=b"x"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_frame_drops_its_peer_and_is_counted(honest_pair, wire, case):
    listener, honest = honest_pair()
    raw = raw_peer(listener, wire)
    try:
        raw.send(MALFORMED[case](raw, wire))
        assert goodbyes(raw, listener, wire) == [wire.C_MALFORMED], "the peer was not dropped"
        still_serves(listener, honest, timeout=ANSWER_TIMEOUT_S)
        stats = listener.stats
        assert stats["malformed"] == stats["dropped_peers"] == 1 and stats["lost"] == 0, stats
        assert len(listener.peers) == 1 and stats["messages_received"] == 2  # nothing of the liar's
    finally:
        raw.close()


def test_a_message_split_mid_message_by_a_new_one_is_malformed(honest_pair, wire):
    """In order, offset 0 begins a message only when none is under way: a peer that restarts one
    halfway breaks the protocol (the old code freed the partial and counted it lost)."""
    listener, honest = honest_pair()
    raw = raw_peer(listener, wire)
    try:
        raw.send(raw.frame(wire.K_DATA, fseq=0, msg_len=20, payload=bytes(10)))
        raw.send(raw.frame(wire.K_DATA, fseq=1, msg_len=20, payload=bytes(10)))
        assert goodbyes(raw, listener, wire) == [wire.C_MALFORMED]
        assert listener.stats["lost"] == 0 and listener.stats["malformed"] == 1
        still_serves(listener, honest, timeout=ANSWER_TIMEOUT_S)
    finally:
        raw.close()


def test_frames_of_an_honest_raw_peer_are_delivered(honest_pair, wire):
    """The raw peer's frames are the shim's own: told the truth, the listener delivers them (so the
    refusals above are the lies' doing)."""
    listener, honest = honest_pair()
    raw = raw_peer(listener, wire)
    try:
        raw.send(raw.frame(wire.K_DATA, fseq=0, msg_len=12, payload=b"hello, "))
        raw.send(raw.frame(wire.K_DATA, fseq=1, msg_len=12, offset=7, payload=b"world"))
        assert drain(listener, 0.3) == [b"hello, world"]
        assert listener.stats["malformed"] == listener.stats["dropped_peers"] == 0
    finally:
        raw.close()


def fuzz_frames(rng: random.Random, raw: RawMemifPeer, wire, limit: int, mode: int) -> tuple[list[bytes], set[bytes]]:
    """A few frames as a buggy or hostile peer might send them: honest messages first, then (by
    `mode`) lies in the fields, flipped bytes, a cut frame, noise, or a message begun and abandoned.
    Returns the frames and the honest messages."""
    frames, whole, fseq = [], set(), 0
    for _ in range(rng.randrange(0, 3)):
        body = rng.randbytes(rng.choice([0, 5, 3000, 20_000]))
        whole.add(body)
        for offset in range(0, max(len(body), 1), 8000):
            frames.append(raw.frame(wire.K_DATA, fseq=fseq, msg_len=len(body), offset=offset,
                                    payload=body[offset:offset + 8000]))
            fseq += 1
    if mode == 0:  # field lies
        msg_len = rng.choice([0, 1, 100, limit, limit + 1, rng.randrange(1 << 32)])
        payload = rng.randbytes(rng.choice([0, 1, 100, 8000]))
        frames.append(raw.frame(rng.choice([wire.K_DATA] * 4 + [wire.K_ACK, wire.K_BYE, wire.K_WELCOME, rng.randrange(256)]),
                                flags=rng.choice([wire.F_TO_LISTENER] * 4 + [0, rng.randrange(256)]),
                                conn=rng.choice([None] * 4 + [rng.randrange(1 << 32)]),
                                token=rng.choice([None] * 4 + [rng.randrange(1 << 32)]),
                                fseq=rng.choice([fseq, fseq, fseq + 1, rng.randrange(1 << 32)]),
                                ack=rng.randrange(1 << 32), msg_len=msg_len,
                                offset=rng.choice([0, 0, 1, rng.randrange(1 << 32)]),
                                frag_len=rng.choice([None, None, 0, rng.randrange(1 << 16)]), payload=payload))
    elif mode == 1:  # flipped bytes in an honest frame
        frame = bytearray(raw.frame(wire.K_DATA, fseq=fseq, msg_len=50, payload=rng.randbytes(50)))
        for _ in range(rng.randrange(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        frames.append(bytes(frame))
    elif mode == 2:  # cut short
        frame = raw.frame(wire.K_DATA, fseq=fseq, msg_len=4000, payload=rng.randbytes(4000))
        frames.append(frame[:rng.randrange(len(frame))])
    elif mode == 3:  # noise
        frames.append(rng.randbytes(rng.randrange(1, 9000)))
    elif mode == 4:  # the start of a long message (over the limit or within it), then nothing
        msg_len = rng.choice([limit + 1, rng.randrange(limit + 1, 1 << 32), rng.randrange(8001, limit + 1)])
        frames.append(raw.frame(wire.K_DATA, fseq=fseq, msg_len=msg_len, payload=bytes(8000)))
    return frames, whole  # mode 5: only honest messages


def test_fuzz_memif_frames(honest_pair, wire):
    """A fixed seed, a fixed number of cases (not a fixed time: a loaded machine runs fewer in a
    window): after them, the listener answers, its memory grew by less than a bound, no message over
    its limit or not sent whole was delivered, and its stats say what it refused."""
    limit = MiB
    rng = random.Random(20240613)
    listener, honest = honest_pair(max_message_bytes=limit, give_up_s=0.5)
    virtual, resident = memory()
    cases = 0
    cap = time.monotonic() + FUZZ_CAP_S
    while cases < FUZZ_CASES and (cases < 6 or time.monotonic() < cap):
        raw = raw_peer(listener, wire)
        try:
            mode = cases if cases < 6 else rng.randrange(6)  # every kind of case first, then at random
            frames, whole = fuzz_frames(rng, raw, wire, limit, mode)
            for frame in frames:
                raw.send(frame)
            for message in drain(listener, 0.03):
                # an honest message, or one a single frame carried whole (its flips in the payload)
                assert message in whole or any(message in frame for frame in frames), \
                    f"case {cases}: a message of {len(message)} B that no frame carried whole"
        finally:
            raw.close()
        cases += 1
    # Stalls time out (give_up_s) and departed ports are given back: wait for that, not for a fixed time.
    settled = time.monotonic() + 10 * ANSWER_TIMEOUT_S  # a cap, not a speed: the assertion is on the peers
    while len(listener.peers) > 1 and time.monotonic() < settled:
        drain(listener, 0.05)
    still_serves(listener, honest, timeout=ANSWER_TIMEOUT_S)
    grown = [after - before for after, before in zip(memory(), (virtual, resident))]
    assert grown[1] < 64 * MiB, f"{cases} fuzz cases grew the listener's memory by {grown[1] / MiB:.0f} MiB"
    stats = listener.stats
    assert stats["malformed"] > 0 and stats["refused_oversize"] > 0 and stats["dropped_peers"] > 0, stats
    assert len(listener.peers) == 1, f"peers left behind: {listener.peers}"
