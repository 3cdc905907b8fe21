"""The replay node: serves any replay memory over any transport to actors and a learner.

One event loop, single-threaded (the memory is not shared). Placement decides how the learner gets
batches: `server` — it sends SAMPLE and waits for the BATCH reply; `in-network` — the node pushes
BATCHes ahead of demand while the learner has credit, and priority updates (which return one
credit each) flow back, so the learner never waits on a request leg.

The node also relays published weights to actors (parameter-server duty) and decides when the run
is over: the env-step budget is counted here, from what actors report they produced.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlbench.arrays import to_host
from rlbench.metrics import Recorder
from rlbench.runtime.distributed.rate_limiter import RateLimiter
from rlbench.runtime.distributed.messages import Op, WireError, decode, encode, json_array, read_json, read_text, text

TRANSITION_FIELDS = ("obs", "action", "reward", "next_obs", "done")
IDLE_POLL_S = 0.02


@dataclass
class NodeSettings:
    placement: str  # "server" or "in-network"
    total_steps: int
    batch_size: int
    seconds: float | None = None
    max_message_bytes: int = 1 << 30


@dataclass
class _Pending:
    peer: int
    request_id: int
    batch_size: int = 0
    beta: float = 0.4


@dataclass
class NodeState:
    produced: int = 0  # transitions actors say they produced (reported with each INSERT)
    stored: int = 0
    rejected: int = 0  # transitions in INSERTs refused as invalid (error reply sent)
    done: bool = False
    done_reason: str = ""
    learner: int | None = None  # peer id of the learner
    credit: int = 0
    beta: float = 0.4
    learner_updates: int = 0
    params: dict[str, np.ndarray] = field(default_factory=dict)
    params_version: int = -1
    reports: dict[str, Any] = field(default_factory=dict)
    last_insert: dict[int, int] = field(default_factory=dict)  # peer -> request id, for idempotent retries
    roles: dict[int, str] = field(default_factory=dict)
    first_insert_t: float | None = None  # perf_counter of the first INSERT (after the roles started)
    first_insert_n: int = 0
    last_insert_t: float | None = None


class ReplayNode:
    def __init__(self, listener: Any, memory: Any, limiter: RateLimiter, settings: NodeSettings) -> None:
        self.listener = listener
        self.memory = memory
        self.limiter = limiter
        self.settings = settings
        self.prioritized = bool(getattr(getattr(memory, "capabilities", None), "prioritized", False))
        self.state = NodeState()
        self.recorder = Recorder()
        self.depths = Recorder()  # queue depths, in items
        self.pending_samples: deque[_Pending] = deque()
        self.pending_inserts: deque[_Pending] = deque()
        self.finished_push_sent = False
        self.shutdown = False
        self.t0 = time.perf_counter()
        self.cpu0 = os.times()

    # ------------------------------------------------------------------------------------ loop
    def serve(self) -> dict[str, Any]:
        clock = time.perf_counter_ns
        while not self.shutdown:
            got = self.listener.recv(timeout=IDLE_POLL_S)
            if got is not None:
                peer, message = got
                t0 = clock()
                op = self._handle(peer, message)
                if op is not None:
                    self.recorder.histogram(f"serve.{op.name}").record(clock() - t0)
            self._check_deadline()
            self._release_pending()
        return self.report()

    def _check_deadline(self) -> None:
        if self.state.done:
            return
        if self.state.produced >= self.settings.total_steps:
            self._finish("step budget reached")
        elif self.settings.seconds is not None and time.perf_counter() - self.t0 >= self.settings.seconds:
            self._finish("time budget reached")

    def _finish(self, reason: str) -> None:
        self.state.done, self.state.done_reason = True, reason

    def _reply(self, peer: int, op: Op, arrays: dict[str, Any] | None = None, request_id: int = 0) -> None:
        try:
            self.listener.send(peer, *encode(op, arrays, request_id))
        except Exception as exc:  # a peer that vanished must not stop the node
            self.recorder.count(f"send_failed.{type(exc).__name__}")

    def _error(self, peer: int, request_id: int, message: str) -> None:
        self.recorder.count("errors")
        self._reply(peer, Op.ERROR, {"message": text(message)}, request_id)

    def _handle(self, peer: int, message: memoryview) -> Op | None:
        try:
            op, request_id, arrays = decode(message, max_bytes=self.settings.max_message_bytes)
        except WireError as exc:
            self.recorder.count("malformed")
            self._error(peer, 0, f"malformed message: {exc}")
            return None
        handler = self._handlers.get(op)
        if handler is None:
            self.recorder.count("unexpected_op")
            self._error(peer, request_id, f"the replay node does not accept {op.name}")
            return op
        try:
            handler(self, peer, request_id, arrays)
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            self.recorder.count("rejected_requests")
            self._error(peer, request_id, f"{op.name} refused: {type(exc).__name__}: {exc}")
        return op

    # -------------------------------------------------------------------------------- handlers
    def _on_hello(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        role = read_text(arrays["role"])
        self.state.roles[peer] = role
        if role == "learner":
            self.state.learner = peer
        self._reply(peer, Op.OK, self._status(), request_id)

    def _on_insert(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        if self.state.last_insert.get(peer) == request_id:  # a retry of an insert we already stored
            self.recorder.count("duplicate_inserts")
            self._reply(peer, Op.OK, self._status(), request_id)
            return
        missing = [f for f in TRANSITION_FIELDS if f not in arrays]
        if missing:
            raise ValueError(f"INSERT lacks {', '.join(missing)}")
        produced = int(arrays["produced"]) if "produced" in arrays else len(arrays["obs"])
        transitions = {f: arrays[f] for f in TRANSITION_FIELDS}
        n = len(transitions["obs"])
        if any(len(v) != n for v in transitions.values()):
            raise ValueError("INSERT fields have different lengths")
        priorities = arrays.get("priorities")
        self.memory.add(transitions, priorities)
        self.state.last_insert[peer] = request_id
        now = time.perf_counter()
        if self.state.first_insert_t is None:
            self.state.first_insert_t, self.state.first_insert_n = now, produced
        self.state.last_insert_t = now
        self.state.produced += produced
        self.state.stored += n
        self.limiter.inserted(n)
        self._check_deadline()
        if self.state.done or self.limiter.can_insert(0):
            self._reply(peer, Op.OK, self._status(), request_id)
        else:  # actors are ahead of the learner: hold the reply, and with it the actor
            self.pending_inserts.append(_Pending(peer, request_id))
            self.depths.histogram("pending_inserts").record(len(self.pending_inserts))

    def _on_sample(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        pending = _Pending(peer, request_id, int(arrays["batch_size"]), float(arrays["beta"]))
        if pending.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.pending_samples.append(pending)
        self.depths.histogram("pending_samples").record(len(self.pending_samples))

    def _on_update_priorities(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        if "learner_updates" in arrays:
            self.state.learner_updates = int(arrays["learner_updates"])
        if "credit" in arrays:
            self.state.credit += int(arrays["credit"])
        if "beta" in arrays:
            self.state.beta = float(arrays["beta"])
        if self.prioritized and len(arrays["indices"]):
            self.memory.update_priorities(arrays["indices"], arrays["priorities"])

    def _on_credit(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        self.state.learner = peer
        self.state.credit += int(arrays["credit"])
        self.state.beta = float(arrays.get("beta", self.state.beta))
        self.depths.histogram("push_credit").record(self.state.credit)

    def _on_publish(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        version = int(arrays.pop("version"))
        self.state.params = {name: array.copy() for name, array in arrays.items()}
        self.state.params_version = version
        self.state.learner_updates = max(self.state.learner_updates, version)  # one-way: no reply

    def _on_fetch(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        have = int(arrays["have_version"])
        if self.state.params_version > have:
            self._reply(peer, Op.PARAMS, {"version": np.int64(self.state.params_version), **self.state.params}, request_id)
        else:
            self._reply(peer, Op.OK, self._status(), request_id)

    def _on_stats(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        self._reply(peer, Op.STATS, {"json": json_array(self.report())}, request_id)

    def _on_bye(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        report = read_json(arrays["report"])
        self.state.reports[str(report.get("role", peer))] = report
        if self.state.learner == peer:
            self.state.learner = None
        self._reply(peer, Op.OK, self._status(), request_id)

    def _on_shutdown(self, peer: int, request_id: int, arrays: dict[str, np.ndarray]) -> None:
        self._finish(self.state.done_reason or "shut down")
        self._release_pending()
        self.shutdown = True
        self._reply(peer, Op.OK, self._status(), request_id)

    _handlers = {Op.HELLO: _on_hello, Op.INSERT: _on_insert, Op.SAMPLE: _on_sample,
                 Op.UPDATE_PRIORITIES: _on_update_priorities, Op.CREDIT: _on_credit, Op.PUBLISH_PARAMS: _on_publish,
                 Op.FETCH_PARAMS: _on_fetch, Op.STATS: _on_stats, Op.BYE: _on_bye, Op.SHUTDOWN: _on_shutdown}

    # --------------------------------------------------------------------------- rate limiting
    def _status(self) -> dict[str, Any]:
        s = self.state
        return {"finished": np.uint8(s.done), "produced": np.int64(s.produced), "stored": np.int64(s.stored),
                "params_version": np.int64(s.params_version), "learner_updates": np.int64(s.learner_updates)}

    def _batch(self, batch_size: int, beta: float) -> dict[str, Any]:
        sample = self.memory.sample(batch_size, beta)
        self.limiter.sampled(batch_size)
        status = self._status()
        assert not status.keys() & sample.transitions.keys(), "status fields would overwrite transitions"
        fields = {"indices": sample.indices, "weights": sample.weights, **sample.transitions}
        return {**{name: to_host(value) for name, value in fields.items()}, **status}  # a device memory's tensors

    def _release_pending(self) -> None:
        size = len(self.memory)
        while self.pending_samples:
            first = self.pending_samples[0]
            if self.state.done:
                self._reply(first.peer, Op.OK, self._status(), first.request_id)
            elif self.limiter.can_sample(first.batch_size, size):
                self._reply(first.peer, Op.BATCH, self._batch(first.batch_size, first.beta), first.request_id)
            else:
                break
            self.pending_samples.popleft()
        if self.settings.placement == "in-network" and self.state.learner is not None:
            self._push(size)
        while self.pending_inserts and (self.state.done or self.limiter.can_insert(0)):
            first = self.pending_inserts.popleft()
            self._reply(first.peer, Op.OK, self._status(), first.request_id)

    def _push(self, size: int) -> None:
        """In-network placement: stream prioritized batches to the learner while it has credit."""
        learner = self.state.learner
        if self.state.done:
            if not self.finished_push_sent:
                self._reply(learner, Op.OK, self._status())
                self.finished_push_sent = True
            return
        while self.state.credit > 0 and self.limiter.can_sample(self.settings.batch_size, size):
            t0 = time.perf_counter_ns()
            self._reply(learner, Op.BATCH, self._batch(self.settings.batch_size, self.state.beta))
            self.recorder.histogram("push.BATCH").record(time.perf_counter_ns() - t0)
            self.state.credit -= 1

    # ---------------------------------------------------------------------------------- report
    def report(self) -> dict[str, Any]:
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
            "done_reason": s.done_reason,
            "rate_limiter": self.limiter.to_dict(),
            "histograms": {name: h.to_dict() for name, h in self.recorder.histograms.items() if h.count},
            "queue_depths": {name: h.summary(unit="items", scale=1) for name, h in self.depths.histograms.items()},
            "counters": dict(self.recorder.counters),
            "link": dict(self.listener.stats),
            "memory": self.memory.stats(),
            "size": len(self.memory),
        }
