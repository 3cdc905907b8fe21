"""A replay memory that lives on a replay node: INSERT, SAMPLE, UPDATE_PRIORITIES and the weights
(PUBLISH / FETCH) spoken over a `Channel`, one call per operation, each timed in the recorder.

`feedback` holds the node's answer to the last INSERT or STATUS (produced so far, the newest weights
version, the learner's updates, whether the run is over): what an actor paces itself by; an actor
asks `status()` before its first step, so one that joins a resumed or running run starts at its step. `step` is the env
step the last batch was drawn at (for annealing beta). An image run's actor's client (`frames=k`,
transitions.frames_of of its spec) sends each INSERT's distinct frames once (messages.py, "Frames").

The data path is kept lean (a round trip to a replay node is a few microseconds over a fast
transport): scalars travel as Python numbers (the codec sends int as int64 and float as float64, as
np.asarray does), and each operation records its latency without a context manager.
"""

from __future__ import annotations

import time
from time import thread_time_ns
from typing import Any, Mapping, Sequence

import numpy as np

from rlbench.kit.framing import reuse_freed_memory
from rlbench.metrics import CPU_SAMPLE_EVERY, Recorder
from rlbench.protocols import Sample
from rlbench.runtime.distributed import messages
from rlbench.runtime.transitions import fields_of
from rlbench.runtime.distributed.channel import Channel, Pending, RemoteError
from rlbench.runtime.distributed.messages import Op


class ReplayClient:
    def __init__(self, channel: Channel, *, recorder: Recorder | None = None, frames: int = 0) -> None:
        self.channel = channel
        # an image run's frames per observation (transitions.frames_of): its INSERTs carry each frame once
        self.frames = frames
        reuse_freed_memory()  # image-sized messages: no page faults per message (rlbench.kit.framing)
        self.recorder = recorder or channel.recorder
        self.feedback = {"produced": 0, "params_version": -1, "learner_updates": 0, "finished": 0}
        self.step = 0
        self.finished = False
        # ns the caller spent inside this client's calls (an INSERT's begin and finish, not the
        # stepping between them): what a role's time split attributes to replay and to weights; and
        # the caller thread's CPU time in them (codec, copies: work, beside the wall time's waiting)
        self.blocked = {"replay": 0, "weights": 0}
        self.cpu = {"replay": 0, "weights": 0}
        # the weights this client moved: PUBLISH_PARAMS sent (the learner), PARAMS received (an actor),
        # as messages and their bytes on the wire (what a run reports per learner update)
        self.weights_traffic = {"published": 0, "published_bytes": 0, "fetched": 0, "fetched_bytes": 0}
        self._cpu_countdown = 1

    def _cpu_clock(self) -> int:
        """The thread's CPU clock as a replay call starts, when this call's CPU is timed; else 0. The
        clock is a syscall (~0.6 us here, a tenth of a shm round trip), so replay calls are sampled as
        metrics.CpuMeter samples steps: one in CPU_SAMPLE_EVERY is timed and counted that many times.
        Weights calls, rare, read the clock each time (weight 1)."""
        self._cpu_countdown -= 1
        if self._cpu_countdown:
            return 0
        self._cpu_countdown = CPU_SAMPLE_EVERY
        return thread_time_ns()

    def _add_cpu(self, category: str, cpu_started: int) -> None:
        if cpu_started:
            self.cpu[category] += (thread_time_ns() - cpu_started) * (CPU_SAMPLE_EVERY if category == "replay" else 1)

    def _took(self, name: str, started: int, cpu_started: int) -> None:
        elapsed = time.perf_counter_ns() - started
        self.recorder.histogram(name).record(elapsed)
        category = "weights" if name.startswith("weights.") else "replay"
        self.blocked[category] += elapsed
        if cpu_started:  # (the call only on the calls whose clock was read)
            self._add_cpu(category, cpu_started)

    def blocked_s(self) -> dict[str, float]:
        return {category: ns / 1e9 for category, ns in self.blocked.items()}

    def cpu_s(self) -> dict[str, float]:
        return {category: ns / 1e9 for category, ns in self.cpu.items()}

    # ---------------------------------------------------------------------------------- actors
    def add(self, transitions: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> None:
        """INSERT and wait for its reply (what was produced is what is inserted)."""
        started, cpu_started = time.perf_counter_ns(), self._cpu_clock()
        _, reply = self.channel.request(Op.INSERT, _insert(transitions, priorities, len(transitions["obs"]),
                                                           self.frames))
        self._inserted(reply, started, cpu_started)

    def add_begin(self, transitions: Mapping[str, np.ndarray], priorities: np.ndarray | None = None, *,
                  produced: int) -> tuple[Pending, int]:
        """Send an INSERT; `add_finish` waits for its reply (an actor steps its env meanwhile).
        `produced`: transitions this actor produced since its last INSERT (stored or not)."""
        started, cpu_started = time.perf_counter_ns(), self._cpu_clock()
        request = self.channel.begin(Op.INSERT, _insert(transitions, priorities, produced, self.frames))
        self.blocked["replay"] += time.perf_counter_ns() - started
        self._add_cpu("replay", cpu_started)
        return request, started

    def add_finish(self, pending: tuple[Pending, int]) -> None:
        request, started = pending
        waited, cpu_started = time.perf_counter_ns(), self._cpu_clock()
        reply = self.channel.finish(request)[1]
        self.blocked["replay"] += time.perf_counter_ns() - waited
        self._add_cpu("replay", cpu_started)  # a spinning wait (shm) is CPU in replay, not ours
        self._inserted(reply, started, 0, blocked=False)

    def _inserted(self, reply: dict[str, np.ndarray], started: int, cpu_started: int, *,
                  blocked: bool = True) -> None:
        if blocked:
            self._took("replay.INSERT", started, cpu_started)
        else:  # begun, then finished after the caller worked: the histogram holds the round trip
            self.recorder.histogram("replay.INSERT").record(time.perf_counter_ns() - started)
        feedback = self.feedback
        feedback["produced"] = int(reply["produced"])
        feedback["params_version"] = int(reply["params_version"])
        feedback["learner_updates"] = int(reply["learner_updates"])
        self.finished = bool(int(reply["finished"]))
        feedback["finished"] = int(self.finished)

    def status(self) -> dict[str, Any]:
        """The node's STATE (messages.state_of), also taken into `feedback`."""
        state = messages.state_of(self.channel.request(Op.STATUS)[1])
        for name in ("produced", "params_version", "learner_updates"):
            self.feedback[name] = state[name]
        self.finished = bool(state["finished"])
        self.feedback["finished"] = int(self.finished)
        return state

    def fetch_params(self, have_version: int) -> tuple[int, list[np.ndarray]] | None:
        """Weights newer than `have_version`, or None (then `finished` says whether the run is over)."""
        started, cpu_started = time.perf_counter_ns(), thread_time_ns()
        op, arrays = self.channel.request(Op.FETCH_PARAMS, {"have_version": int(have_version)})
        self._took("weights.FETCH", started, cpu_started)
        if op == Op.PARAMS:
            self.weights_traffic["fetched"] += 1
            self.weights_traffic["fetched_bytes"] += messages.encoded_bytes(op, arrays)
            return messages.read_weights(arrays)
        self.finished = self.finished or bool(arrays["finished"])
        return None

    # --------------------------------------------------------------------------------- learner
    def sample(self, batch_size: int, beta: float) -> Sample | None:
        """Server placement: a batch, or None once the run is over."""
        started, cpu_started = time.perf_counter_ns(), self._cpu_clock()
        op, arrays = self.channel.request(Op.SAMPLE, {"batch_size": int(batch_size), "beta": float(beta)})
        self._took("replay.SAMPLE", started, cpu_started)
        return self._to_sample(op, arrays)

    def wait_pushed(self, timeout: float) -> Sample | None:
        """In-network placement: the next batch the node pushed, or None once the run is over."""
        t0, cpu_started = time.perf_counter_ns(), self._cpu_clock()
        while True:
            got = self.channel.next_push(timeout)
            if got is None:
                raise RemoteError(f"no batch pushed by the replay node within {timeout:.0f} s")
            op, arrays = got
            if op in (Op.BATCH, Op.END):
                self._took("replay.SAMPLE", t0, cpu_started)
                return self._to_sample(op, arrays)
            self.recorder.count(f"unexpected_push.{op.name}")

    def _to_sample(self, op: Op, arrays: dict[str, np.ndarray]) -> Sample | None:
        if op != Op.BATCH:
            self.finished = True
            return None
        self.step = int(arrays["step"])
        return Sample(arrays["indices"], fields_of(messages.unshifted(arrays)), arrays["weights"])

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, *, learner_updates: int,
                          credit: int | None = None, beta: float | None = None) -> None:
        # half the bytes of int64 and float64 (the priority updates were most of a learner's bytes once
        # weights went out every 50 updates): the learner's priorities are float32 already, and int32
        # holds every index of a memory below 2**31 items; the node takes either
        indices = np.asarray(indices)
        narrow = not len(indices) or int(indices.max()) < 2**31
        arrays: dict[str, Any] = {"indices": indices.astype(np.int32 if narrow else np.int64, copy=False),
                                  "priorities": np.asarray(priorities, dtype=np.float32),
                                  "learner_updates": int(learner_updates)}
        if credit is not None:
            arrays.update(credit=int(credit), beta=float(beta))
        started, cpu_started = time.perf_counter_ns(), self._cpu_clock()
        self.channel.send(Op.UPDATE_PRIORITIES, arrays)
        self._took("replay.UPDATE_PRIORITIES", started, cpu_started)

    def credit(self, credit: int, beta: float) -> None:
        """In-network placement: let the node push `credit` more batches ahead."""
        started, cpu_started = time.perf_counter_ns(), self._cpu_clock()
        self.channel.send(Op.CREDIT, {"credit": int(credit), "beta": float(beta)})
        self.blocked["replay"] += time.perf_counter_ns() - started
        self._add_cpu("replay", cpu_started)

    def publish_params(self, weights: Sequence[np.ndarray], version: int) -> None:
        started, cpu_started = time.perf_counter_ns(), thread_time_ns()
        arrays = messages.weights_arrays(weights, version)
        self.channel.send(Op.PUBLISH_PARAMS, arrays)
        self._took("weights.PUBLISH", started, cpu_started)
        self.weights_traffic["published"] += 1
        self.weights_traffic["published_bytes"] += messages.encoded_bytes(Op.PUBLISH_PARAMS, arrays)

    def checkpoint(self, number: int) -> int:
        """Learner 0: the node writes its part of checkpoint `number` (the learner's is written); returns
        the env steps it holds (rlbench/runtime/checkpoint.py)."""
        _, state = self.channel.request(Op.CHECKPOINT, {"number": int(number)})
        return int(state["produced"])

    # ---------------------------------------------------------------------------------- anyone
    def bye(self, report: dict[str, Any]) -> None:
        """Leave, handing the node this role's final counters."""
        self.channel.request(Op.BYE, {"report": messages.json_array(report)})

    def link_stats(self) -> dict[str, int]:
        return self.channel.stats

    def close(self) -> None:
        self.channel.close()


def _insert(transitions: Mapping[str, np.ndarray], priorities: np.ndarray | None, produced: int,
            frames: int = 0) -> dict[str, Any]:
    """An INSERT's arrays: the transition's fields (`frames` > 0: the observations' frames, each once),
    and what it says it produced. `produced`: transitions produced since the last INSERT (stored or not)."""
    arrays: dict[str, Any] = fields_of(transitions)
    if frames:
        arrays.update(messages.framed(arrays.pop("obs"), arrays.pop("next_obs"), frames))
    arrays["produced"] = int(produced)
    if priorities is not None:
        arrays["priorities"] = np.asarray(priorities, dtype=np.float64)
    return arrays
