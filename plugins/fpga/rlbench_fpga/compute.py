"""Compute backend "fpga": actor MLP inference and tabular TD updates as OpenCL FPGA kernels.

Deep-algorithm learners (dqn, ddpg) are not built here: `torch_device()` gives torch's CPU device and
the capabilities and fingerprint say so ("learner runs on torch CPU").
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import numpy as np
import pyopencl as cl

from rlbench.kit.tabular import TabularInputError, TdBatch, check_step_sizes, prepare_batch
from rlbench_fpga import device as devices
from rlbench_fpga.capabilities import COMPUTE_CAPABILITIES, LEARNER_NOTE
from rlbench_fpga.mlp import OpenclMLP
from rlbench_fpga.perf_model import DEFAULT_BOARD, tabular_seconds
from rlbench_fpga.program import build


class FpgaCompute:
    capabilities = COMPUTE_CAPABILITIES

    def __init__(self, **ignored_options: Any) -> None:
        self._context, self._device, self.device_info = devices.default_context()

    def torch_device(self) -> Any:
        """LEARNER_NOTE: no OpenCL training kernels; the learner runs where the core's cpu backend runs
        it (its torch device and thread count, so it does not take every core)."""
        import rlbench

        return rlbench.get_registry().get("compute", "cpu").create().torch_device()

    def mlp_inference(self, layer_sizes: Sequence[int], *, hidden_activation: str = "relu",
                      output_activation: str = "identity") -> OpenclMLP:
        return OpenclMLP(self._context, layer_sizes, hidden_activation=hidden_activation,
                         output_activation=output_activation)

    def tabular(self, n_states: int, n_actions: int) -> "OpenclTabularEngine":
        return OpenclTabularEngine(self._context, n_states, n_actions)

    def fingerprint(self) -> dict[str, Any]:
        return {**self.device_info.as_dict(), "learner": LEARNER_NOTE, "pyopencl": cl.VERSION_TEXT}


class OpenclTabularEngine:
    """TabularEngine: a float64 Q-table in device memory, updated in order by one single work-item.
    `q` reads the table back when it changed since the last read."""

    def __init__(self, context: Any, n_states: int, n_actions: int) -> None:
        if int(n_states) < 1 or int(n_actions) < 1:
            raise TabularInputError(f"a Q-table needs at least one state and one action, got ({n_states}, {n_actions})")
        self.n_states, self.n_actions = int(n_states), int(n_actions)
        if self.n_states * self.n_actions >= 1 << 31:
            raise TabularInputError(f"a ({n_states}, {n_actions}) table exceeds 32-bit indexing on the device")
        self._context = context
        self._queue = cl.CommandQueue(context)
        self._kernel = cl.Kernel(build(context, "tabular.cl", {}), "td_update")
        self._host = np.zeros((self.n_states, self.n_actions), dtype=np.float64)
        self._table = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=self._host)
        self._stale = False

    @property
    def q(self) -> np.ndarray:
        if self._stale:
            cl.enqueue_copy(self._queue, self._host, self._table, is_blocking=True)
            self._stale = False
        return self._host

    def update(self, batch: Mapping[str, np.ndarray], *, rule: str, alpha: float, gamma: float) -> None:
        check_step_sizes(alpha, gamma)
        self._run(self._checked(prepare_batch(batch, rule)), rule, alpha, gamma, sweeps=1)

    def fit_offline(self, dataset: Mapping[str, np.ndarray], *, rule: str, alpha: float, gamma: float,
                    epochs: int) -> dict[str, Any]:
        check_step_sizes(alpha, gamma)
        if int(epochs) < 1:
            raise TabularInputError(f"epochs must be >= 1, got {epochs!r}")
        batch = self._checked(prepare_batch(dataset, rule))
        t0 = time.perf_counter()
        self._run(batch, rule, alpha, gamma, sweeps=int(epochs))
        self._queue.finish()
        seconds = time.perf_counter() - t0
        updates = len(batch) * int(epochs)
        info = devices.default_context()[2]
        return {"engine": "fpga", "timing": "measured", "device": info.device, "emulation": info.emulation,
                "updates": updates, "epochs": int(epochs), "seconds": seconds,
                "updates_per_s": updates / seconds if seconds > 0 else float("inf"),
                "modelled": {"board": DEFAULT_BOARD.name, "timing": "modelled",
                             "seconds": tabular_seconds(len(batch), int(epochs), DEFAULT_BOARD)}}

    def _checked(self, batch: TdBatch) -> TdBatch:
        """Ranges are checked here, before anything reaches the device."""
        limits = {"obs": self.n_states, "next_obs": self.n_states, "action": self.n_actions,
                  "next_action": self.n_actions}
        for name, limit in limits.items():
            ids = getattr(batch, name)
            if ids is None or not len(ids):
                continue
            bad = np.flatnonzero((ids < 0) | (ids >= limit))
            if bad.size:
                row = int(bad[0])
                raise TabularInputError(f"batch[{name!r}][{row}] = {int(ids[row])} is outside [0, {limit}) "
                                        f"for a ({self.n_states}, {self.n_actions}) table")
        return batch

    def _run(self, batch: TdBatch, rule: str, alpha: float, gamma: float, sweeps: int) -> None:
        n = len(batch)
        if n == 0:
            return
        staging = np.empty(n + (5 * n + 1) // 2, dtype=np.float64)  # n doubles, then 5n int32
        staging[:n] = batch.reward
        ids = staging[n:].view(np.int32)
        for k, column in enumerate((batch.obs, batch.action, batch.next_obs, batch.next_action, batch.done)):
            ids[k * n:(k + 1) * n] = 0 if column is None else column
        buffer = cl.Buffer(self._context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=staging)
        self._kernel(self._queue, (1,), (1,), self._table, buffer, np.int32(n), np.int32(self.n_actions),
                     np.int32(rule == "sarsa"), np.float64(alpha), np.float64(gamma), np.int32(sweeps))
        self._stale = True
