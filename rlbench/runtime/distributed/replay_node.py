"""The replay node: serves any replay memory over any transport to a run's actors and learner.

One event loop, single-threaded (the memory is not shared). Placement decides how the learner gets
batches: `server` — it sends SAMPLE and waits for the BATCH reply; `in-network` — the node pushes
BATCHes ahead of demand while the learner has credit, and priority updates (which return one
credit each) flow back, so the learner never waits on a request leg.

The node also relays published weights to actors (parameter-server duty) and decides when the run
is over: the env-step budget is counted here, from what actors report they produced; the launcher
can end it earlier (FINISH), after which the node still takes the roles' last inserts, reports and
goodbyes until SHUTDOWN.

Nothing a peer sends can stop, stall or poison it, honest or hostile:
- every message is decoded against its op's schema (`messages.decode`); every peer proves its
  role's key, derived from the run's secret, before anything else (when the node has one), so it can
  act only as itself; each op is accepted only from the roles allowed to send it; any error while
  handling a message becomes an ERROR reply and a counter — the serve loop never sees an exception;
- nothing a peer sends waits on another: the listener never blocks on a peer that does not read
  (a slow consumer is dropped, kit.framing.Outbox); an identity (role and index) holds one
  connection, its newest authenticated one replacing the one before (`sessions_replaced`, what the
  old one had waiting discarded, as a session takeover does), so its bounds hold per identity: at
  most MAX_WAITING_SAMPLES SAMPLEs waiting and MAX_HELD_INSERTS INSERT replies held (more is
  refused, counted); a stranger is dropped (or ignored) after MAX_ERRORS_BEFORE_AUTH refusals; a
  peer that left is forgotten with what it had waiting (`_forget_departed`), at the cost of what it
  had; what waits is indexed (`Waiting`), so the node's work per message is O(1) however much waits;
- the run fixes what is stored and counted: INSERTs carry the run's transition layout
  (NodeSettings.layout, from its environment's spec, not from whoever writes first) and exactly
  the transitions they say they produced; the node counts per peer what it stored. An image run's
  INSERTs carry each frame once (messages.py, "Frames"): indices that do not stack the frames they
  came with, or stack another number than the run's (NodeSettings.frames), are refused
  (`refused.frames`). The core's memories built with as many frames take the frames and indices as
  they come (`add_packed`: each frame looked up once, no stack built); any other memory is given
  the stacks, rebuilt exactly here.

Fast path: for the core memories (their `native_handle()`), rlbench._wire's FastPath serves INSERT,
SAMPLE and UPDATE_PRIORITIES in one C call per message — decode, the peer's authentication and role,
the memory operation, the counters, the rate limiter (its Python methods) and the reply's bytes. It
takes only what this module would accept and serve the same way, and changes nothing before it is
sure; everything else (refusals, errors, the first INSERT, retries, waiting SAMPLEs, other ops,
plugin memories) goes through `_handle` here. `NodeSettings.fast_path` turns it off;
the report's "fast_path" says whether it ran and how many messages it served.

Timing, per op: `serve.OP` is the node's handling of one message from its arrival to its reply
handed to the transport (the transport's send is the wire's, not counted; a SAMPLE's includes its
draw, not the time it waited), `memory.OP` the memory operation inside it.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
import math
import os
import resource
import sys
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rlbench.arrays import to_host
from rlbench.errors import RlbenchError
from rlbench.kit.framing import raise_descriptor_limit, reuse_freed_memory
from rlbench.machine_state import threads_in_use
from rlbench.metrics import Recorder
from rlbench.runtime import transitions
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.messages import Op, WireError
from rlbench.runtime.distributed.rate_limiter import RateLimiter

IDLE_POLL_S = 0.02
PRE_AUTH_OPS = (Op.HELLO, Op.AUTH)
FAST_OPS = (Op.INSERT, Op.SAMPLE, Op.UPDATE_PRIORITIES)
# Per-identity bounds (an identity holds one connection). An honest actor has one INSERT in flight and
# the learner one SAMPLE; these leave room for retries and pipelining, and bound what one key can make
# the node hold.
MAX_HELD_INSERTS = 4  # INSERT replies the rate limiter holds for one actor
MAX_WAITING_SAMPLES = 4  # SAMPLEs waiting for the limiter, per learner
MAX_ERRORS_BEFORE_AUTH = 16  # refusals a peer gets before it authenticates; then it is dropped (or ignored)
# Admission (a listener that keeps strangers apart, Listener.expect_admission): a role says HELLO as
# soon as it connects and authenticates in two round trips (milliseconds; a second on a loaded 2-core
# host), and what it sent before the node got to it does not count against it (the listener's rule)
HANDSHAKE_S = 10.0  # a peer silent this long after it connected, or not authenticated after it spoke, is closed
MAX_STRANGERS = 128  # peers not authenticated yet; past this the listener sheds the oldest silent one first
FORGET_EVERY_S = 1.0  # how often the node forgets peers whose connection is gone
FORGET_SLICE = 512  # the most departed peers forgotten in one turn of the serve loop
SWITCH_INTERVAL_S = 0.0002  # the interpreter's thread switch interval while the node serves (see serve)


@dataclass
class NodeSettings:
    placement: str  # "server" or "in-network"
    total_steps: int
    batch_size: int
    seconds: float | None = None
    max_message_bytes: int = 1 << 30
    secret: bytes | None = field(default=None, repr=False)  # the run's; None: no authentication (benchmarks only)
    fast_path: bool = True  # serve the core memories' hot ops natively when rlbench._wire is built
    layout: transitions.Layout | None = None  # the run's transitions (None: the first INSERT fixes them)
    frames: int = 0  # an image run's frames per observation (transitions.frames_of): a framed INSERT's; 0: any
    checkpoint_dir: str | None = None  # where learner 0's CHECKPOINTs go (rlbench/runtime/checkpoint.py); None: refused
    shard: int = 0  # this node's shard of the run's replay (--replay-shards): its BATCHes carry the memory's
    shards: int = 1  # priority mass when there are several (rlbench/runtime/distributed/shards.py)
    handshake_s: float = HANDSHAKE_S  # admission, where the listener has it: see HANDSHAKE_S, MAX_STRANGERS
    max_strangers: int = MAX_STRANGERS


@dataclass
class Peer:
    """What the node knows of one connection (the fast path reads and writes these fields by name)."""

    role: str = ""
    index: int = 0
    authenticated: bool = False
    refused: bool = False  # failed authentication: every later message is refused
    client_nonce: bytes = b""
    node_nonce: bytes = b""
    last_insert: int = -1  # request id of its last stored INSERT, for idempotent retries
    stored: int = 0  # transitions stored from it
    held: int = 0  # its INSERT replies the rate limiter holds
    waiting: int = 0  # its SAMPLEs waiting for the limiter
    errors: int = 0  # refusals before it authenticated

    @property
    def name(self) -> str:
        return messages.role_name(self.role, self.index)


@dataclass(eq=False)  # each one itself (Waiting keys them by identity)
class _Pending:
    peer: int
    request_id: int
    batch_size: int = 0
    beta: float = 0.4
    handled_ns: int = 0  # the node's time on it before it waited (serve.SAMPLE adds the draw)


class Waiting:
    """Requests waiting for the rate limiter: SAMPLEs, or INSERTs whose reply is held (all of size 0).

    `first` is the oldest of the smallest batch size: the limiter's conditions only tighten with the
    size, so when it may not go no other may, and asking costs O(1) however many wait; one that waits
    for a large batch holds back no smaller one. Each peer's requests are reachable from it, so
    forgetting a peer costs what it had. (The fast path reads only its length.)"""

    def __init__(self) -> None:
        self._by_size: dict[int, OrderedDict[_Pending, None]] = {}  # each size's, in order of arrival
        self._sizes: list[int] = []  # a heap of the sizes in _by_size, and of some emptied since (skipped)
        self._in_heap: set[int] = set()
        self._by_peer: dict[int, list[_Pending]] = {}  # (a few each: MAX_WAITING_SAMPLES, MAX_HELD_INSERTS)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, pending: _Pending) -> None:
        size = pending.batch_size
        queue = self._by_size.get(size)
        if queue is None:
            queue = self._by_size[size] = OrderedDict()
            if size not in self._in_heap:
                heapq.heappush(self._sizes, size)
                self._in_heap.add(size)
        queue[pending] = None
        self._by_peer.setdefault(pending.peer, []).append(pending)
        self._count += 1

    def first(self) -> _Pending | None:
        sizes = self._sizes
        while sizes and sizes[0] not in self._by_size:
            self._in_heap.discard(heapq.heappop(sizes))
        return next(iter(self._by_size[sizes[0]])) if sizes else None

    def remove(self, pending: _Pending) -> None:
        queue = self._by_size[pending.batch_size]
        del queue[pending]
        if not queue:
            del self._by_size[pending.batch_size]
            if len(self._sizes) > 2 * len(self._by_size) + 64:  # mostly emptied sizes: rebuilt, O(1) amortised
                self._sizes = sorted(self._by_size)  # (a sorted list is a heap)
                self._in_heap = set(self._sizes)
        mine = self._by_peer[pending.peer]
        mine.remove(pending)
        if not mine:
            del self._by_peer[pending.peer]
        self._count -= 1

    def remove_peer(self, peer_id: int) -> int:
        """Forget one peer's requests; how many there were."""
        mine = list(self._by_peer.get(peer_id, ()))
        for pending in mine:
            self.remove(pending)
        return len(mine)


@dataclass
class NodeState:
    """The node's counters (the fast path reads and writes these fields by name)."""

    produced: int = 0  # transitions actors say they produced (reported with each INSERT)
    stored: int = 0
    done: bool = False
    done_reason: str = ""
    failure: str = ""  # the node's own failure (its memory's), which ended the run: the run's headline reason
    learner: int | None = None  # peer id of the learner
    credit: int = 0
    beta: float = 0.4
    learner_updates: int = 0
    params: dict[str, np.ndarray] = field(default_factory=dict)
    params_version: int = -1
    reports: dict[str, Any] = field(default_factory=dict)
    first_insert_t: float | None = None  # perf_counter of the first INSERT (after the roles started)
    first_insert_n: int = 0  # produced, counted with the first INSERT
    last_insert_t: float | None = None


class Refused(ValueError):
    """A request the node refuses for a reason it counts under `counter`."""

    def __init__(self, message: str, counter: str) -> None:
        super().__init__(message)
        self.counter = counter


class ReplayNode:
    def __init__(self, listener: Any, memory: Any, limiter: RateLimiter, settings: NodeSettings, *,
                 prioritized: bool) -> None:
        self.listener = listener
        self.memory = memory
        self.limiter = limiter
        self.settings = settings
        self.prioritized = prioritized
        self.capacity = int(getattr(memory, "capacity", 0)) or None
        # frames per observation of a memory that takes a framed INSERT's frames as they come (the core's
        # built with frames=k: add_packed); 0: any other, which is given the stacks rebuilt
        takes_packed = callable(getattr(memory, "add_packed", None))
        self.packed_frames = int(getattr(memory, "frames", 0) or 0) if takes_packed else 0
        self.state = NodeState()
        self.peers: dict[int, Peer] = {}
        self.recorder = Recorder()
        self.depths = Recorder()  # queue depths, in items
        self.pending_samples = Waiting()  # the fast path holds this one: kept, never replaced
        self.pending_inserts = Waiting()
        # the connection each identity (role, index) holds: its newest authenticated one replaces the one before
        self.sessions: dict[tuple[str, int], int] = {}
        self.sessions_per_role: Counter[str] = Counter()
        self.stored_by: dict[str, int] = {}  # transitions stored per role, of peers no longer connected
        self.end_pushed = False
        self.params_message = b""  # the newest weights, as a PARAMS message (request id 0)
        self.shutdown = False
        self.t0 = time.perf_counter()
        self.cpu0 = os.times()
        self.cpu_thread0 = time.thread_time_ns()  # the serving thread's own CPU clock, from serve() on
        self._message_t0 = 0  # perf_counter_ns when the message being handled arrived
        self._sent_ns = 0  # time in the transport's send while handling it (the wire's, not the node's)
        self.resumed_from: dict[str, Any] | None = None  # the checkpoint this node continues (restore)
        self.checkpoints: list[dict[str, Any]] = []  # the ones it wrote: number, env steps, seconds
        self.fast, self.fast_path_note = self._fast_path()
        # One descriptor per peer: the process's soft limit up to its hard one; and peers that have not
        # authenticated kept apart where the listener can (strangers never displace roles)
        self.descriptors = raise_descriptor_limit()
        # the report's threads_in_use imports it: at the end of a flood that holds every descriptor it could not
        import threadpoolctl  # noqa: F401
        expect_admission, self._admit = getattr(listener, "expect_admission", None), getattr(listener, "admit", None)
        if expect_admission is not None:
            expect_admission(handshake_s=settings.handshake_s, max_strangers=settings.max_strangers)

    # ------------------------------------------------------------------------------------ loop
    def serve(self) -> dict[str, Any]:
        # What start-up made (the memory, the codecs, imported modules) is never garbage: frozen, a full
        # collection no longer walks it (under a mass departure of 12,500 peers, 50 ms pauses of the loop).
        gc.freeze()
        # A transport's helper thread (shm's accept thread) needs the interpreter lock a few times per
        # new connection; while this loop is busy, each handoff waits out the switch interval (5 ms by
        # default), which made an honest peer's handshake take hundreds of ms under a flood. A thread
        # that does not ask for the lock costs nothing at any interval.
        reuse_freed_memory()  # image-sized messages: no page faults per message (rlbench.kit.framing)
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL_S))
        try:
            return self._serve()
        finally:
            sys.setswitchinterval(switch_interval)
            gc.unfreeze()  # (a node served inside a longer process leaves it as it was)

    def _serve(self) -> dict[str, Any]:
        self.cpu_thread0 = time.thread_time_ns()  # (a transport may run threads of its own)
        clock = time.perf_counter_ns
        recv, send = self.listener.recv, self.listener.send
        fast = self.fast.handle if self.fast is not None else None
        pending_samples, pending_inserts, state = self.pending_samples, self.pending_inserts, self.state
        in_network = self.settings.placement == "in-network"
        forget_at = time.monotonic() + FORGET_EVERY_S
        served = 0
        while not self.shutdown:
            got = recv(timeout=IDLE_POLL_S)
            if got is not None:
                peer, message = got
                served += 1
                reply = None
                if fast is not None:
                    try:
                        reply = fast(peer, message)
                    except Exception as exc:  # unexpected: the fast path leaves every refusal to _handle
                        reply = True
                        self._error(peer, _request_id_of(message), f"refused: {type(exc).__name__}: {exc}",
                                    "rejected_requests")
                if reply is not None:  # served (deadline checked): bytes to send, or True
                    if reply is not True:
                        try:
                            send(peer, reply)
                        except Exception as exc:  # a peer that vanished, or did not read, must not stop the node
                            self._send_failed(peer, exc)
                    if pending_samples or pending_inserts or (in_network and state.learner is not None):
                        self._release_pending()  # what this message may have freed (or the pushes)
                    if served & 1023:  # (and now and then, the chores below)
                        continue
                else:
                    self._message_t0 = t0 = clock()
                    self._sent_ns = 0
                    op = self._handle(peer, message)
                    if op is not None and op != Op.SAMPLE:  # a SAMPLE's is recorded when it is served
                        self.recorder.histogram(f"serve.{op.name}").record(clock() - t0 - self._sent_ns)
            self._check_deadline()
            self._release_pending()
            if time.monotonic() >= forget_at:
                more = self._forget_departed()  # (the next slice at the next turn of the loop)
                forget_at = time.monotonic() + (0.0 if more else FORGET_EVERY_S)
        return self.report()

    def _pushing(self) -> bool:
        return self.settings.placement == "in-network" and self.state.learner is not None

    # ------------------------------------------------------------------------------ fast path
    def _fast_path(self) -> tuple[Any, str]:
        """(rlbench._wire's FastPath over this node's memory, "") or (None, why not)."""
        if not self.settings.fast_path:
            return None, "off (NodeSettings.fast_path)"
        if messages.NATIVE is None:
            return None, messages.NATIVE_REASON
        native_handle = getattr(self.memory, "native_handle", None)
        handle = native_handle() if callable(native_handle) else None
        if handle is None or self.capacity is None:
            return None, f"{type(self.memory).__name__} has no native handle: every message takes the general path"
        from rlbench._wire import FastPath

        seconds = self.settings.seconds
        fast = FastPath(codec=messages.NATIVE, memory=handle.memory, tree=handle.tree, rng=handle.rng, int64=np.int64,
                        peers=self.peers, state=self.state, pending_samples=self.pending_samples, limiter=self.limiter,
                        allowed={int(op): messages.ALLOWED_ROLES[op] for op in FAST_OPS},
                        ops={op.name: int(op) for op in Op}, total_steps=self.settings.total_steps,
                        deadline=self.t0 + seconds if seconds is not None else math.inf, capacity=self.capacity,
                        max_message_bytes=self.settings.max_message_bytes, max_credit=messages.MAX_CREDIT,
                        prioritized=self.prioritized, check_deadline=self._check_deadline,
                        hold_insert=self._hold_insert, drain=self._drain_fast_timings, max_held=MAX_HELD_INSERTS,
                        mass=self.settings.shards > 1)
        return fast, ""

    def _drain_fast_timings(self) -> None:
        """The fast path's serve and memory times into this node's histograms."""
        if self.fast is not None:
            for name, values in self.fast.take_timings().items():
                self.recorder.histogram(name).record_many(values)

    def _check_deadline(self) -> None:
        if self.state.done:
            return
        if self.state.produced >= self.settings.total_steps:
            self._finish("step budget reached")
        elif self.settings.seconds is not None and time.perf_counter() - self.t0 >= self.settings.seconds:
            self._finish("time budget reached")

    def _finish(self, reason: str) -> None:
        self.state.done, self.state.done_reason = True, reason

    @contextlib.contextmanager
    def _memory_call(self, operation: str) -> Iterator[None]:
        """A call into the memory. Its refusal of a request (an RlbenchError, as the ReplayMemory
        contract has it: rlbench.kit.replay.ReplayError) goes back to the peer; any other exception is
        the memory failing, after which nothing can be stored or drawn: the node ends the run with it
        as the reason (the launcher's headline, not the roles that then leave) and refuses the request."""
        try:
            yield
        except RlbenchError:
            raise
        except Exception as exc:
            failure = f"its replay memory failed in {operation}: {type(exc).__name__}: {exc}"
            if not self.state.failure:
                self.state.failure = failure
                self._finish(failure)
            raise Refused(failure, "memory_failed") from exc  # (counted: each request refused for it)

    def _reply(self, peer: int, op: Op, arrays: dict[str, Any] | None = None, request_id: int = 0) -> None:
        self._send(peer, messages.encode(op, arrays, request_id))

    def _send(self, peer: int, parts: list[Any]) -> None:
        started = time.perf_counter_ns()
        try:
            self.listener.send(peer, *parts)
        except Exception as exc:  # a peer that vanished, or did not read, must not stop the node
            self._send_failed(peer, exc)
        self._sent_ns += time.perf_counter_ns() - started

    def _send_failed(self, peer: int, exc: Exception) -> None:
        self.recorder.count(f"send_failed.{type(exc).__name__}")
        if isinstance(exc, ConnectionError):  # gone, or dropped as a slow consumer: forget what it had waiting
            self._forget(peer)

    def _error(self, peer: int, request_id: int, message: str, counter: str) -> None:
        self.recorder.count(counter)
        self._reply(peer, Op.ERROR, {"message": messages.text(message[:4000])}, request_id)

    def _refuse(self, peer_id: int, peer: Peer, request_id: int, message: str, counter: str) -> None:
        """An ERROR reply, unless a peer that has not authenticated has had its share of them: then it
        is dropped (where the listener can) and nothing more of it is answered."""
        if not peer.authenticated:
            peer.errors += 1
            if peer.errors > MAX_ERRORS_BEFORE_AUTH:
                self.recorder.count(counter)
                self.recorder.count("ignored_before_auth")
                if not peer.refused:
                    peer.refused = True
                    self._drop(peer_id, "dropped_before_auth")
                return
        self._error(peer_id, request_id, message, counter)

    def _drop(self, peer_id: int, counter: str) -> None:
        """Close a peer's connection where the listener can (the node forgets it either way); what it
        sent before is only counted."""
        self.recorder.count(counter)
        drop = getattr(self.listener, "drop", None)
        if drop is not None:
            drop(peer_id)
        peer = self.peers.get(peer_id)
        if peer is not None:
            peer.refused = True
        self._forget(peer_id, keep=True)

    def _forget(self, peer_id: int, *, keep: bool = False) -> None:
        """A peer gone (or dropped): its session ends, its waiting SAMPLEs and held INSERT replies go
        too; `keep` keeps its entry (a refused peer stays refused while its messages still come).
        Costs what the peer had, not what everyone has."""
        peer = self.peers.get(peer_id) if keep else self.peers.pop(peer_id, None)
        if peer is None:
            return
        if not keep and peer.stored:
            self.stored_by[peer.name] = self.stored_by.get(peer.name, 0) + peer.stored
        self._end_session(peer_id, peer)
        forgotten = self.pending_samples.remove_peer(peer_id) + self.pending_inserts.remove_peer(peer_id)
        if forgotten:
            self.recorder.count("forgotten_requests", forgotten)
        peer.waiting = peer.held = 0
        if self.state.learner == peer_id:
            self.state.learner = None

    def _end_session(self, peer_id: int, peer: Peer) -> None:
        """Nothing more from this connection as its identity (it left, was dropped or replaced)."""
        identity = (peer.role, peer.index)
        if peer.authenticated and self.sessions.get(identity) == peer_id:
            del self.sessions[identity]
            self.sessions_per_role[peer.role] -= 1
        peer.authenticated = False

    def _forget_departed(self) -> bool:
        """Forget peers whose connection is gone, so the peer table and what waits stay bounded: at
        most FORGET_SLICE of them per call, so that a mass departure does not hold up the peers still
        here (12,500 forgotten in one pass blocked the node for 60 ms). True when more are left."""
        departed = self.peers.keys() - set(self.listener.peers)
        for peer_id in itertools.islice(departed, FORGET_SLICE):
            self.recorder.count("departed")
            self._forget(peer_id)
        return len(departed) > FORGET_SLICE

    def _handle(self, peer_id: int, message: memoryview) -> Op | None:
        """Decode, authorise and handle one message; anything wrong becomes an ERROR reply."""
        peer = self.peers.get(peer_id)
        if peer is None:
            peer = self.peers[peer_id] = Peer()
        if peer.refused:  # its refusal was said once; what it sends after is only counted
            self.recorder.count("refused_peer_messages")
            return None
        try:
            op, request_id, arrays = messages.decode(message, max_bytes=self.settings.max_message_bytes)
        except WireError as exc:
            self._refuse(peer_id, peer, exc.request_id, f"malformed message: {exc}", "malformed")
            return None
        if not peer.authenticated and op not in PRE_AUTH_OPS:
            self._refuse(peer_id, peer, request_id, f"{op.name} before authentication (send HELLO first)",
                         "unauthenticated")
            return op
        if peer.authenticated and op in PRE_AUTH_OPS:
            self._error(peer_id, request_id, f"{op.name}: this connection is already authenticated as "
                                             f"{peer.name}", "forbidden")
            return op
        allowed = messages.ALLOWED_ROLES.get(op)
        if op not in PRE_AUTH_OPS and (allowed is None or peer.role not in allowed):
            self._error(peer_id, request_id, f"the replay node does not accept {op.name} from a {peer.role or 'peer'}",
                        "forbidden")
            return op
        try:
            self._handlers[op](self, peer_id, peer, request_id, arrays)
        except Refused as refusal:
            self._refuse(peer_id, peer, request_id, f"{op.name} refused: {refusal}", refusal.counter)
        except Exception as exc:  # the memory's own refusals (ReplayError) and anything else
            self._refuse(peer_id, peer, request_id, f"{op.name} refused: {type(exc).__name__}: {exc}",
                         "rejected_requests")
        return op

    # ----------------------------------------------------------------------------- handshake
    def _on_hello(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        role = messages.read_text(arrays["role"])
        if role not in messages.ROLES:
            raise ValueError(f"unknown role {role!r} (roles: {', '.join(messages.ROLES)})")
        peer.role, peer.index, peer.authenticated = role, int(arrays["index"]), False
        secret = self.settings.secret
        if secret is None:
            self._welcome(peer_id, peer, request_id)
            return
        peer.client_nonce, peer.node_nonce = bytes(arrays["nonce"]), os.urandom(messages.NONCE_BYTES)
        key = messages.role_key(secret, role, peer.index)
        proof = messages.node_proof(key, peer.client_nonce, peer.node_nonce)
        self._reply(peer_id, Op.CHALLENGE, {"nonce": np.frombuffer(peer.node_nonce, np.uint8),
                                            "proof": np.frombuffer(proof, np.uint8)}, request_id)

    def _on_auth(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        secret = self.settings.secret
        if secret is None or not peer.node_nonce:
            raise ValueError("AUTH without a CHALLENGE (send HELLO first)")
        key = messages.role_key(secret, peer.role, peer.index)
        expected = messages.role_proof(key, peer.role, peer.index, peer.node_nonce, peer.client_nonce)
        peer.node_nonce = b""  # one try per challenge
        if not messages.proofs_match(expected, arrays["proof"]):
            self._error(peer_id, request_id, f"authentication failed: wrong proof of the key of {peer.name}",
                        "auth_failed")
            peer.refused = True
            self._drop(peer_id, "dropped_after_auth_failed")
            return
        self._welcome(peer_id, peer, request_id)

    def _welcome(self, peer_id: int, peer: Peer, request_id: int) -> None:
        # One connection per identity, so the bounds hold per identity: its newest replaces the one
        # before (a role that reconnected, or a takeover with its key), as a session takeover does
        identity = (peer.role, peer.index)
        replaced = self.sessions.get(identity)
        if replaced is not None:
            self._drop(replaced, "sessions_replaced")
        self.sessions[identity] = peer_id
        self.sessions_per_role[peer.role] += 1
        peer.authenticated = True
        if self._admit is not None:
            self._admit(peer_id)
        if peer.role == "learner":
            self.state.learner = peer_id
        self.recorder.count(f"joined.{peer.role}")
        self._reply(peer_id, Op.WELCOME, None, request_id)

    # ------------------------------------------------------------------------------- data path
    def _on_insert(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        state = self.state
        if peer.last_insert == request_id:  # a retry of an insert we already stored
            self.recorder.count("duplicate_inserts")
            self._reply(peer_id, Op.INSERTED, self._inserted(), request_id)
            return
        n = len(arrays["reward"])
        if int(arrays["produced"]) != n:
            raise Refused(f"produced = {int(arrays['produced'])}, but the message carries {n} transitions (the node "
                          "counts what it stores)", "refused.produced")
        if peer.held >= MAX_HELD_INSERTS:
            raise Refused(f"{peer.held} replies to this actor's INSERTs are held by the rate limiter already (at most "
                          f"{MAX_HELD_INSERTS}): wait for a reply before sending more", "refused.held_replies")
        packed = "frames" in arrays  # each frame once (messages.py, "Frames")
        if packed:
            problem = messages.frames_problem(arrays, self.settings.frames)
            if problem:
                raise Refused(problem, "refused.frames")
            if arrays["obs_frames"].shape[1] != self.packed_frames:  # this memory takes stacks: rebuilt, exactly
                arrays, packed = messages.stacked(arrays), False
        if not state.stored and self.settings.layout is not None:  # (after that, the memory keeps the layout)
            checked = {**arrays, **messages.stacked_stand_ins(arrays)} if packed else arrays
            mismatch = transitions.layout_mismatch(self.settings.layout, checked)
            if mismatch:
                raise Refused(mismatch, "refused.layout")
        started = time.perf_counter_ns()
        with self._memory_call("add_packed" if packed else "add"):
            if packed:
                self.memory.add_packed({name: arrays[name] for name in transitions.FIELDS if name in arrays},
                                       arrays["frames"], arrays["obs_frames"], arrays["next_obs_frames"],
                                       arrays.get("priorities"))
            else:
                self.memory.add(transitions.fields_of(arrays), arrays.get("priorities"))
        self.recorder.histogram("memory.INSERT").record(time.perf_counter_ns() - started)
        peer.last_insert = request_id
        peer.stored += n
        now = time.perf_counter()
        if state.first_insert_t is None:
            state.first_insert_t, state.first_insert_n = now, state.produced + n
        state.last_insert_t = now
        state.produced += n
        state.stored += n
        self.limiter.inserted(n)
        self._check_deadline()
        if state.done or self.limiter.can_insert(0):
            self._reply(peer_id, Op.INSERTED, self._inserted(), request_id)
        else:  # actors are ahead of the learner: hold the reply, and with it the actor
            self._hold_insert(peer_id, request_id)

    def _hold_insert(self, peer_id: int, request_id: int) -> None:
        self.peers[peer_id].held += 1
        self.pending_inserts.add(_Pending(peer_id, request_id))
        self.depths.histogram("pending_inserts").record(len(self.pending_inserts))

    def _inserted(self) -> dict[str, Any]:
        s = self.state
        return {"produced": np.int64(s.produced), "params_version": np.int64(s.params_version),
                "learner_updates": np.int64(s.learner_updates), "finished": np.uint8(s.done)}

    def _on_sample(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        pending = _Pending(peer_id, request_id, int(arrays["batch_size"]), float(arrays["beta"]))
        if self.capacity is not None and pending.batch_size > self.capacity:
            raise ValueError(f"batch_size {pending.batch_size} exceeds the memory's capacity {self.capacity}: "
                             "it could never be served")
        if peer.waiting >= MAX_WAITING_SAMPLES:
            raise Refused(f"{peer.waiting} SAMPLEs of this learner wait for the rate limiter already (at most "
                          f"{MAX_WAITING_SAMPLES})", "refused.waiting_samples")
        pending.handled_ns = time.perf_counter_ns() - self._message_t0 - self._sent_ns
        peer.waiting += 1
        self.pending_samples.add(pending)
        self.depths.histogram("pending_samples").record(len(self.pending_samples))

    def _on_update_priorities(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        self.state.learner_updates = int(arrays["learner_updates"])
        if "credit" in arrays:
            self._add_credit(arrays)
        if self.prioritized and len(arrays["indices"]):
            started = time.perf_counter_ns()
            self.memory.update_priorities(arrays["indices"], arrays["priorities"])
            self.recorder.histogram("memory.UPDATE_PRIORITIES").record(time.perf_counter_ns() - started)

    def _on_credit(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        self._add_credit(arrays)
        self.depths.histogram("push_credit").record(self.state.credit)

    def _add_credit(self, arrays: dict[str, np.ndarray]) -> None:
        self.state.credit = min(messages.MAX_CREDIT, self.state.credit + int(arrays["credit"]))
        self.state.beta = float(arrays["beta"])

    # ---------------------------------------------------------------------------------- weights
    def _on_publish(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        version, weights = messages.read_weights(arrays)
        self.state.params = {f"w{i}": w for i, w in enumerate(weights)}  # copies: the view ends at the next receive
        self.state.params_version = version
        self.state.learner_updates = max(self.state.learner_updates, version)  # one-way: no reply
        # encoded once per version: every actor that fetches it gets these bytes under its own request id
        self.params_message = messages.joined(messages.encode(Op.PARAMS, {"version": np.int64(version),
                                                                          **self.state.params}))

    def _on_fetch(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        if self.state.params_version > int(arrays["have_version"]):
            self._send(peer_id, messages.with_request_id(self.params_message, request_id))
        else:
            self._reply(peer_id, Op.CURRENT, {"finished": np.uint8(self.state.done)}, request_id)

    # ---------------------------------------------------------------------------------- control
    def _on_status(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        s = self.state
        actors = self.sessions_per_role["actor"]
        self._reply(peer_id, Op.STATE, {
            "finished": np.uint8(s.done), "produced": np.int64(s.produced), "stored": np.int64(s.stored),
            "params_version": np.int64(s.params_version), "learner_updates": np.int64(s.learner_updates),
            "actors": np.int64(actors), "done_reason": messages.text(s.done_reason)}, request_id)

    def _on_stats(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        self._reply(peer_id, Op.REPORT, {"json": messages.json_array(self.report())}, request_id)

    def _on_bye(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        self.state.reports[peer.name] = messages.read_json(arrays["report"])
        if self.state.learner == peer_id:
            self.state.learner = None
        self._end_session(peer_id, peer)  # it said goodbye: nothing more from it
        self._reply(peer_id, Op.OK, None, request_id)

    def _on_finish(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        if not self.state.done:
            self._finish(messages.read_text(arrays["reason"]))
        self._reply(peer_id, Op.OK, None, request_id)

    def _on_shutdown(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        self._finish(self.state.done_reason or "shut down")
        self._release_pending()
        self.shutdown = True
        self._reply(peer_id, Op.OK, None, request_id)

    # ------------------------------------------------------------------------------ checkpoints
    def _on_checkpoint(self, peer_id: int, peer: Peer, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        from rlbench.runtime import checkpoint

        number = int(arrays["number"])
        if peer.index != 0:
            raise Refused("only learner 0 starts checkpoints", "refused.checkpoint")
        if self.settings.checkpoint_dir is None:
            raise Refused("this run was started without a checkpoint directory", "refused.checkpoint")
        if self.checkpoints and number <= self.checkpoints[-1]["number"]:
            raise Refused(f"checkpoint {number} is not newer than {self.checkpoints[-1]['number']}", "refused.checkpoint")
        started = time.perf_counter()
        checkpoint.save_replay(self.settings.checkpoint_dir, number, self.settings.shard, self.checkpoint_state(),
                               self.memory)
        self.checkpoints.append({"number": number, "env_steps": self.state.produced,
                                 "learner_updates": self.state.learner_updates,
                                 "seconds": round(time.perf_counter() - started, 4)})
        self._on_status(peer_id, peer, request_id, arrays)  # its counters as of its half: the learner commits

    def checkpoint_state(self) -> dict[str, Any]:
        """What the node restores from besides its memory: counters, the limiter's counts, the newest
        weights, what it stored per role, how often the run was resumed."""
        s = self.state
        return {"produced": s.produced, "stored": s.stored, "learner_updates": s.learner_updates,
                "params_version": s.params_version, "params": dict(s.params),
                "limiter": {"inserts": self.limiter.inserts, "samples": self.limiter.samples},
                "stored_by": _summed((self.resumed_from or {}).get("stored_by", {}), self._stored_by()),
                "resumes": (self.resumed_from or {}).get("resumes", 0), "written_at": time.time()}

    def restore(self, saved: dict[str, Any], checkpoint_path: str) -> None:
        """Continue from a checkpoint's node state (its memory already restored, before serving)."""
        s = self.state
        s.produced, s.stored, s.learner_updates = saved["produced"], saved["stored"], saved["learner_updates"]
        self.limiter.inserts, self.limiter.samples = saved["limiter"]["inserts"], saved["limiter"]["samples"]
        if saved["params"]:
            self.state.params = saved["params"]
            s.params_version = saved["params_version"]
            self.params_message = messages.joined(messages.encode(Op.PARAMS, {"version": np.int64(s.params_version),
                                                                              **s.params}))
        self.resumed_from = {"checkpoint": Path(checkpoint_path).name, "directory": str(Path(checkpoint_path).parent),
                             "env_steps": saved["produced"], "stored": saved["stored"],
                             "learner_updates": saved["learner_updates"], "written_at": saved["written_at"],
                             "stored_by": saved["stored_by"], "resumes": saved.get("resumes", 0) + 1}
        self._check_deadline()

    _handlers = {Op.HELLO: _on_hello, Op.AUTH: _on_auth, Op.INSERT: _on_insert, Op.SAMPLE: _on_sample,
                 Op.UPDATE_PRIORITIES: _on_update_priorities, Op.CREDIT: _on_credit, Op.PUBLISH_PARAMS: _on_publish,
                 Op.FETCH_PARAMS: _on_fetch, Op.STATUS: _on_status, Op.STATS: _on_stats, Op.BYE: _on_bye,
                 Op.FINISH: _on_finish, Op.SHUTDOWN: _on_shutdown, Op.CHECKPOINT: _on_checkpoint}

    # --------------------------------------------------------------------------- rate limiting
    def _batch(self, batch_size: int, beta: float, request_id: int = 0, *, timed: bool = False) -> list[Any]:
        """A BATCH drawn now, encoded (the fast path's when it can draw it); `timed`: a SAMPLE
        request's, whose memory time is recorded."""
        if self.fast is not None:
            message = self.fast.batch(batch_size, beta, request_id)
            if message is not None:
                return [message]
        started = time.perf_counter_ns()
        with self._memory_call("sample"):
            sample = self.memory.sample(batch_size, beta)
        if timed:
            self.recorder.histogram("memory.SAMPLE").record(time.perf_counter_ns() - started)
        self.limiter.sampled(batch_size)
        fields = {"indices": sample.indices, "weights": sample.weights, **sample.transitions}
        batch = {name: to_host(value) for name, value in fields.items()}  # a device memory's tensors
        stacks = messages.shifted_stacks(batch["obs"], batch["next_obs"])
        if stacks is not None:  # a memory of frames: each row's frames once (messages.py, "Frames")
            del batch["obs"], batch["next_obs"]
            batch["stacks"] = stacks
        batch["step"] = np.int64(self.state.produced)
        if self.settings.shards > 1:  # after the draw, as the fast path adds them
            batch["mass"], batch["min_mass"] = (np.float64(m) for m in self.memory.priority_mass())
        return messages.encode(Op.BATCH, batch, request_id)

    def _release_pending(self) -> None:
        """Serve what waits and may go now. Only what goes is looked at, and the one after it that may
        not (Waiting.first: then no other may), so this costs O(1) per message plus what it serves."""
        size = len(self.memory)
        state, limiter, peers = self.state, self.limiter, self.peers
        samples, inserts = self.pending_samples, self.pending_inserts
        while samples:  # (a failed send may make the node forget a peer, and what it had waiting, meanwhile)
            pending = samples.first()
            if not (state.done or limiter.can_sample(pending.batch_size, size)):
                break
            samples.remove(pending)
            peers[pending.peer].waiting -= 1
            if state.done:
                self._reply(pending.peer, Op.END, {"finished": np.uint8(1)}, pending.request_id)
            else:
                self._serve_sample(pending)
        if self._pushing():
            self._push(size)
        while inserts and (state.done or limiter.can_insert(0)):
            pending = inserts.first()
            inserts.remove(pending)
            peers[pending.peer].held -= 1
            self._reply(pending.peer, Op.INSERTED, self._inserted(), pending.request_id)

    def _serve_sample(self, pending: _Pending) -> None:
        started = time.perf_counter_ns()
        try:
            batch = self._batch(pending.batch_size, pending.beta, pending.request_id, timed=True)
        except Exception as exc:
            self._error(pending.peer, pending.request_id, f"SAMPLE refused: {type(exc).__name__}: {exc}",
                        "rejected_requests")
            return
        self.recorder.histogram("serve.SAMPLE").record(pending.handled_ns + time.perf_counter_ns() - started)
        self._send(pending.peer, batch)

    def _push(self, size: int) -> None:
        """In-network placement: stream prioritized batches to the learner while it has credit."""
        learner = self.state.learner
        if self.state.done:
            if not self.end_pushed:
                self._reply(learner, Op.END, {"finished": np.uint8(1)})
                self.end_pushed = True
            return
        while self.state.credit > 0 and self.state.learner is not None and self.limiter.can_sample(self.settings.batch_size, size):
            t0 = time.perf_counter_ns()
            try:
                batch = self._batch(self.settings.batch_size, self.state.beta)
            except Exception as exc:
                self.recorder.count(f"push_failed.{type(exc).__name__}")
                return
            self._send(learner, batch)
            self.recorder.histogram("push.BATCH").record(time.perf_counter_ns() - t0)
            self.state.credit -= 1

    # ---------------------------------------------------------------------------------- report
    def _stored_by(self) -> dict[str, int]:
        """Transitions the node stored, per role (its own count, not what roles report)."""
        counts = dict(self.stored_by)
        for peer in self.peers.values():
            if peer.stored:
                counts[peer.name] = counts.get(peer.name, 0) + peer.stored
        return counts

    def time_split(self, wall: float) -> dict[str, float]:
        """The node's time: the memory's operations (replay), its own handling of messages around them
        (decoding, checks, replies: bookkeeping, the part of it its thread spent on the CPU), waiting
        for messages (idle), and its thread's CPU time (cpu_s; wall time off the CPU is waiting)."""
        def total(prefix: str) -> float:
            return sum(h.total for name, h in self.recorder.histograms.items() if name.startswith(prefix)) / 1e9

        replay = total("memory.")
        handling = total("serve.") + total("push.")
        cpu = (time.thread_time_ns() - self.cpu_thread0) / 1e9
        bookkeeping = max(0.0, min(handling - replay, cpu - replay))
        return {"replay": replay, "bookkeeping": bookkeeping, "idle": max(0.0, wall - handling),
                "window_s": wall, "cpu_s": cpu, "waiting": max(0.0, wall - cpu),
                "bookkeeping_share": bookkeeping / cpu if cpu > 0 else float("nan")}

    def report(self) -> dict[str, Any]:
        self._drain_fast_timings()
        wall = time.perf_counter() - self.t0
        cpu1 = os.times()
        s = self.state
        return {
            "role": "replay",
            "wall_s": wall,
            "cpu_s": (cpu1.user - self.cpu0.user) + (cpu1.system - self.cpu0.system),
            "produced": s.produced,
            "stored": s.stored,
            # env steps/s between the first and the last INSERT: the run without role start-up
            "steady_env_steps_per_s": (s.produced - s.first_insert_n) / (s.last_insert_t - s.first_insert_t)
            if s.first_insert_t is not None and s.last_insert_t > s.first_insert_t else None,
            "first_insert_t": s.first_insert_t,  # perf_counter (CLOCK_MONOTONIC: comparable across this host's processes)
            "last_insert_t": s.last_insert_t,
            "done_reason": s.done_reason,
            "failure": s.failure,
            "rate_limiter": self.limiter.to_dict(),
            "histograms": {name: h.to_dict() for name, h in self.recorder.histograms.items() if h.count},
            "queue_depths": {name: h.summary(unit="items", scale=1) for name, h in self.depths.histograms.items()},
            "counters": dict(self.recorder.counters),
            "link": dict(self.listener.stats),
            "memory": self.memory.stats(),
            "time_split": self.time_split(wall),
            "size": len(self.memory),
            "peers": len(self.peers),
            "sessions": dict(+self.sessions_per_role),  # authenticated identities connected now, per role
            "threads": threads_in_use(),
            "rss_bytes": _rss_bytes(),
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "stored_by": self._stored_by(),
            "limits": {"max_held_inserts": MAX_HELD_INSERTS, "max_waiting_samples": MAX_WAITING_SAMPLES,
                       "max_errors_before_auth": MAX_ERRORS_BEFORE_AUTH},
            "descriptors": self.descriptors,  # the open-descriptor limit: soft before start-up, soft, hard
            "fast_path": {"on": True, "served": self.fast.handled} if self.fast is not None
            else {"on": False, "why": self.fast_path_note},
            "reports": s.reports,
            "resumed_from": self.resumed_from,
            "checkpoints": self.checkpoints,
        }


def _summed(*counts: dict[str, int]) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for name, n in count.items():
            total[name] = total.get(name, 0) + n
    return total


def _rss_bytes() -> int:
    """This process's resident memory now (0 where /proc does not tell)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _request_id_of(message: Any) -> int:
    """The request id in a message's header (0 when it has none), to answer it."""
    header = bytes(memoryview(message)[:messages.HEADER.size])
    return messages.HEADER.unpack(header)[3] if len(header) == messages.HEADER.size else 0
