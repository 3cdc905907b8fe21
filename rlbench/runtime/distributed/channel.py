"""A request/reply channel over one transport connection: how every role (and the launcher) talks to
the replay node.

- `request(op, arrays)` sends and waits for the matching reply; `begin` / `finish` split that, so a
  caller works while its request is in flight (an actor steps its environment while its INSERT is
  answered). Replies are matched by request id; a reply that arrives while another call waits is
  kept for its own `finish`.
- `send(op, arrays)` is one-way; `next_push(timeout)` returns what the node pushed (request id 0):
  in-network batches, END.
- On a transport that declares itself unreliable, a request that times out is sent again with the
  same id (the node recognises a retried INSERT and does not store it twice).
- `authenticate(role, index, key)` runs the HELLO / CHALLENGE / AUTH handshake of `messages`:
  the role proves its key (`messages.role_key` of the run's secret) and the node proves it knows
  the secret it comes from; nothing else is sent before it.

An ERROR reply raises `RemoteError` with the node's message.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Mapping

import numpy as np

from rlbench.errors import RlbenchError
from rlbench.metrics import Recorder
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.messages import Op, decode, encode


class RemoteError(RlbenchError):
    """The replay node answered ERROR, could not be reached, or could not prove the run's secret."""


Reply = tuple[Op, dict[str, np.ndarray]]
Pending = tuple[Op, int, bytes]


class Channel:
    def __init__(self, connection: Any, *, reliable: bool = True, timeout: float = 30.0, retries: int = 5,
                 recorder: Recorder | None = None) -> None:
        self.connection = connection
        self.timeout = timeout
        self.retries = 0 if reliable else retries
        self.recorder = recorder or Recorder()
        self.pushed: deque[Reply] = deque()
        self._outstanding: set[int] = set()  # begun, not finished
        self._early: dict[int, Reply] = {}  # their replies, when another call read them
        self._next_id = 1

    def authenticate(self, role: str, index: int, key: bytes | None) -> None:
        """Introduce this role; with its key, prove it and check the node proves it too."""
        nonce = os.urandom(messages.NONCE_BYTES)
        op, arrays = self.request(Op.HELLO, {"role": messages.text(role), "index": np.int64(index),
                                             "nonce": np.frombuffer(nonce, np.uint8)})
        if op == Op.WELCOME and key is None:
            return
        if op != Op.CHALLENGE or key is None:
            raise RemoteError("the replay node runs without authentication but this role has a key" if key
                              else "the replay node requires authentication and this role has no key")
        node_nonce = bytes(arrays["nonce"])
        if not messages.proofs_match(messages.node_proof(key, nonce, node_nonce), arrays["proof"]):
            raise RemoteError("the replay node could not prove the run's secret: refusing to talk to it")
        proof = messages.role_proof(key, role, index, node_nonce, nonce)
        op, _ = self.request(Op.AUTH, {"proof": np.frombuffer(proof, np.uint8)})
        if op != Op.WELCOME:
            raise RemoteError(f"authentication answered {op.name}")

    def request(self, op: Op, arrays: Mapping[str, Any] | None = None) -> Reply:
        """One request and its reply (views valid until the next receive). Over a reliable transport
        the send and the first receive are one `connection.request` (one native call on some)."""
        if self.retries:
            return self.finish(self.begin(op, arrays))
        request_id = self._next_id
        self._next_id = request_id % 0xFFFFFFFF + 1
        try:
            message = self.connection.request(*encode(op, arrays, request_id), timeout=self.timeout)
        except TimeoutError:
            raise RemoteError(f"no reply to {op.name} from the replay node within {self.timeout:.0f} s") from None
        reply_op, reply_id, reply = decode(message)
        if reply_id != request_id:  # a push or another request's reply came first: keep it, wait on
            self._outstanding.add(request_id)
            try:
                self._keep(reply_op, reply_id, reply)
                reply_op, reply = self._await_reply(op, request_id, b"")
            finally:
                self._outstanding.discard(request_id)
        if reply_op == Op.ERROR:
            raise RemoteError(f"replay node refused {op.name}: {messages.read_text(reply['message'])}")
        return reply_op, reply

    def begin(self, op: Op, arrays: Mapping[str, Any] | None = None) -> Pending:
        """Send a request now and collect its reply later with `finish`. The message is kept (as one
        bytes object) only for a retry over an unreliable transport."""
        request_id = self._next_id
        self._next_id = request_id % 0xFFFFFFFF + 1
        parts = encode(op, arrays, request_id)
        self.connection.send(*parts)
        self._outstanding.add(request_id)
        return op, request_id, messages.joined(parts) if self.retries else b""

    def finish(self, pending: Pending) -> Reply:
        op, request_id, kept = pending
        try:
            early = self._early.pop(request_id, None) if self._early else None
            reply_op, reply = early if early is not None else self._await_reply(op, request_id, kept)
        finally:
            self._outstanding.discard(request_id)
        if reply_op == Op.ERROR:
            raise RemoteError(f"replay node refused {op.name}: {messages.read_text(reply['message'])}")
        return reply_op, reply

    def _await_reply(self, op: Op, request_id: int, kept: bytes) -> Reply:
        for attempt in range(self.retries + 1):
            if attempt:
                self.connection.send(kept)
            deadline = time.monotonic() + self.timeout
            while True:
                remaining = deadline - time.monotonic()
                message = self.connection.recv(timeout=remaining) if remaining > 0 else None
                if message is None:
                    break
                reply_op, reply_id, reply = decode(message)
                if reply_id == request_id:
                    return reply_op, reply
                self._keep(reply_op, reply_id, reply)
            self.recorder.count("request_timeouts")
        raise RemoteError(f"no reply to {op.name} from the replay node within {self.timeout:.0f} s"
                          + (f" after {self.retries} retries" if self.retries else ""))

    def _keep(self, reply_op: Op, reply_id: int, reply: dict[str, np.ndarray]) -> None:
        """A message that is not the reply being waited for."""
        if reply_id == 0:  # a push that arrived while we waited
            self.pushed.append((reply_op, _copied(reply)))
        elif reply_id in self._outstanding:  # the reply to another request still in flight
            self._early[reply_id] = (reply_op, _copied(reply))
        else:
            self.recorder.count("stale_replies")  # the answer to a request we already retried

    def send(self, op: Op, arrays: Mapping[str, Any] | None = None) -> None:
        """One-way message (the node sends no reply)."""
        self.connection.send(*encode(op, arrays, 0))

    def next_push(self, timeout: float) -> Reply | None:
        """The next message the node pushed, or None when none came within `timeout`."""
        if self.pushed:
            return self.pushed.popleft()
        message = self.connection.recv(timeout=timeout)
        if message is None:
            return None
        op, _, arrays = decode(message)
        if op == Op.ERROR:
            raise RemoteError(f"replay node error: {messages.read_text(arrays['message'])}")
        return op, arrays

    @property
    def stats(self) -> dict[str, int]:
        return dict(self.connection.stats)

    def close(self) -> None:
        self.connection.close()


def _copied(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Kept for later: a received view lives only until the connection's next receive."""
    return {name: array.copy() for name, array in arrays.items()}
