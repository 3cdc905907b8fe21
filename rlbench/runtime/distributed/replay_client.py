"""A replay memory that lives elsewhere: the ReplayMemory protocol spoken over a transport.

Replies are matched to requests by request id; anything else that arrives meanwhile is a push from
an in-network replay node and is queued (copied, since a received view lives only until the next
receive). On a transport that declares itself unreliable, a request that times out is sent again
with the same id; the node recognises the retry and does not store an INSERT twice.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Mapping

import numpy as np

from rlbench.errors import RlbenchError
from rlbench.metrics import Recorder
from rlbench.protocols import ReplayCapabilities, Sample
from rlbench.runtime.distributed.messages import Op, decode, encode, read_text

TRANSITION_FIELDS = ("obs", "action", "reward", "next_obs", "done")
# "finished" (the run is over) must not share a name with a transition field: a BATCH carries both.
STATUS_FIELDS = ("finished", "produced", "stored", "params_version", "learner_updates")


class ReplayNodeError(RlbenchError):
    """The replay node answered ERROR, or could not be reached."""


class ReplayClient:
    def __init__(self, connection: Any, *, prioritized: bool, capacity: int, reliable: bool = True,
                 recorder: Recorder | None = None, timeout: float = 30.0, retries: int = 5) -> None:
        self.connection = connection
        self.capabilities = ReplayCapabilities(prioritized=prioritized, device="remote")
        self.capacity = capacity
        self.reliable = reliable
        self.recorder = recorder or Recorder()
        self.timeout = timeout
        self.retries = retries if not reliable else 0
        self.status: dict[str, int] = {"finished": 0, "produced": 0, "stored": 0, "params_version": -1, "learner_updates": 0}
        self.pushed: deque[tuple[Op, dict[str, np.ndarray]]] = deque()
        self._outstanding: set[int] = set()  # begun, not finished
        self._early: dict[int, tuple[Op, dict[str, np.ndarray]]] = {}  # their replies, when another call read them
        self._next_id = 1

    # ------------------------------------------------------------------------------ plumbing
    def _take_status(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name in STATUS_FIELDS:
            if name in arrays:
                self.status[name] = int(arrays[name])

    def call(self, op: Op, arrays: Mapping[str, Any] | None = None) -> tuple[Op, dict[str, np.ndarray]]:
        """One request and its reply (views valid until the next receive)."""
        return self.finish(self.begin(op, arrays))

    def begin(self, op: Op, arrays: Mapping[str, Any] | None = None) -> tuple[Op, int, bytes]:
        """Send a request now and collect its reply later with `finish`, so the caller works meanwhile.
        The message is kept (as one bytes object) only for a retry over an unreliable transport."""
        request_id = self._next_id
        self._next_id = self._next_id % 0xFFFFFFFF + 1
        parts = encode(op, arrays, request_id)
        self.connection.send(*parts)
        self._outstanding.add(request_id)
        kept = b"".join(bytes(memoryview(p).cast("B")) if not isinstance(p, bytes) else p for p in parts) \
            if self.retries else b""
        return op, request_id, kept

    def finish(self, pending: tuple[Op, int, bytes]) -> tuple[Op, dict[str, np.ndarray]]:
        op, request_id, kept = pending
        try:
            return self._await_reply(op, request_id, kept)
        finally:
            self._outstanding.discard(request_id)

    def _await_reply(self, op: Op, request_id: int, kept: bytes) -> tuple[Op, dict[str, np.ndarray]]:
        if request_id in self._early:  # its status was taken when it arrived, in order
            reply_op, reply = self._early.pop(request_id)
            return self._accept(op, reply_op, reply, take_status=False)
        for attempt in range(self.retries + 1):
            if attempt:
                self.connection.send(kept)
            deadline = time.monotonic() + self.timeout
            while True:
                remaining = deadline - time.monotonic()
                message = self.connection.recv(timeout=max(0.0, remaining)) if remaining > 0 else None
                if message is None:
                    break
                reply_op, reply_id, reply = decode(message)
                if reply_id == request_id:
                    return self._accept(op, reply_op, reply)
                if reply_id == 0:  # a push that arrived while we waited
                    self.pushed.append((reply_op, {k: v.copy() for k, v in reply.items()}))
                elif reply_id in self._outstanding:  # the reply to another request still in flight
                    if reply_op != Op.ERROR:
                        self._take_status(reply)
                    self._early[reply_id] = (reply_op, {k: v.copy() for k, v in reply.items()})
                else:
                    self.recorder.count("stale_replies")  # the answer to a request we already retried
            self.recorder.count("request_timeouts")
        raise ReplayNodeError(f"no reply to {op.name} from the replay node within {self.timeout:.0f} s"
                              + (f" after {self.retries} retries" if self.retries else ""))

    def _accept(self, op: Op, reply_op: Op, reply: dict[str, np.ndarray], *,
                take_status: bool = True) -> tuple[Op, dict[str, np.ndarray]]:
        if reply_op == Op.ERROR:
            raise ReplayNodeError(f"replay node refused {op.name}: {read_text(reply['message'])}")
        if take_status:
            self._take_status(reply)
        return reply_op, reply

    def send(self, op: Op, arrays: Mapping[str, Any] | None = None) -> None:
        """One-way message (the node sends no reply)."""
        self.connection.send(*encode(op, arrays, 0))

    def next_push(self, timeout: float) -> tuple[Op, dict[str, np.ndarray]] | None:
        if self.pushed:
            return self.pushed.popleft()
        message = self.connection.recv(timeout=timeout)
        if message is None:
            return None
        op, request_id, arrays = decode(message)
        if op == Op.ERROR:
            raise ReplayNodeError(f"replay node error: {read_text(arrays['message'])}")
        self._take_status(arrays)
        return op, arrays

    # ------------------------------------------------------------------- the memory protocol
    def __len__(self) -> int:
        return int(self.status["stored"])

    def add(self, transitions: Mapping[str, np.ndarray], priorities: np.ndarray | None = None, *,
            produced: int | None = None) -> np.ndarray:
        self.add_finish(self.add_begin(transitions, priorities, produced=produced))
        return np.empty(0, dtype=np.int64)  # positions are the node's business

    def add_begin(self, transitions: Mapping[str, np.ndarray], priorities: np.ndarray | None = None, *,
                  produced: int | None = None) -> tuple[tuple[Op, int, bytes], int]:
        """Send an INSERT; `add_finish` waits for its reply (an actor steps its env meanwhile)."""
        arrays = {name: transitions[name] for name in TRANSITION_FIELDS}
        n = len(arrays["obs"])
        arrays["produced"] = np.int64(n if produced is None else produced)
        if priorities is not None:
            arrays["priorities"] = np.asarray(priorities, dtype=np.float64)
        return self.begin(Op.INSERT, arrays), time.perf_counter_ns()

    def add_finish(self, pending: tuple[tuple[Op, int, bytes], int]) -> None:
        request, t0 = pending
        self.finish(request)
        self.recorder.histogram("replay.INSERT").record(time.perf_counter_ns() - t0)

    def sample(self, batch_size: int, beta: float = 0.4) -> Sample | None:
        """A batch, or None once the run is over (server placement: a SAMPLE request)."""
        with self.recorder.time("replay.SAMPLE"):
            op, arrays = self.call(Op.SAMPLE, {"batch_size": np.int64(batch_size), "beta": np.float64(beta)})
        return self._to_sample(op, arrays)

    def wait_pushed(self, timeout: float) -> Sample | None:
        """In-network placement: the next pushed batch, or None once the run is over."""
        t0 = time.perf_counter_ns()
        while True:
            got = self.next_push(timeout)
            if got is None:
                raise ReplayNodeError(f"no batch pushed by the replay node within {timeout:.0f} s")
            op, arrays = got
            if op in (Op.BATCH, Op.OK):
                self.recorder.histogram("replay.SAMPLE").record(time.perf_counter_ns() - t0)
                return self._to_sample(op, arrays)
            self.recorder.count(f"unexpected_push.{op.name}")

    def _to_sample(self, op: Op, arrays: dict[str, np.ndarray]) -> Sample | None:
        if op != Op.BATCH:
            return None
        transitions = {name: arrays[name] for name in TRANSITION_FIELDS}
        return Sample(arrays["indices"], transitions, arrays["weights"])

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, **extra: Any) -> None:
        arrays = {"indices": np.asarray(indices, dtype=np.int64), "priorities": np.asarray(priorities, dtype=np.float64)}
        arrays.update({k: np.asarray(v) for k, v in extra.items()})
        with self.recorder.time("replay.UPDATE_PRIORITIES"):
            self.send(Op.UPDATE_PRIORITIES, arrays)

    def stats(self) -> dict[str, Any]:
        return dict(self.status)
