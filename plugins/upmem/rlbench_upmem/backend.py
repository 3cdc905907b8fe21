"""The `upmem` compute backend: tabular engines whose updates run on emulated DPUs.

- fit_offline (SwiftRL): the dataset is scattered over `dpus` DPUs, each sweeps its chunk, the host
  averages the tables. Returns the emulator's measured time and the cost model's prediction, apart.
- update(batch) (online): the whole batch goes to one DPU holding the table, which applies it in
  order; the result equals the exact sequential update in the DPU's arithmetic (fp32 or int32).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from rlbench.errors import RlbenchError
from rlbench_upmem.capabilities import CAPABILITIES, TABULAR_ONLY, fingerprint
from rlbench_upmem.emulator import (DEFAULT_SCALE, DEFAULT_TASKLETS, NUMERICS, PARTITIONS, DpuBudget, PimSystem,
                                    check_step, choose, run_offline)
from rlbench_upmem.hardware import dpu_count


class UpmemCompute:
    capabilities = CAPABILITIES

    def __init__(self, dpus: int = 64, numeric: str = "fp32", partition: str = "contiguous",
                 fixed_point_scale: int = DEFAULT_SCALE, tasklets: int = DEFAULT_TASKLETS,
                 sync_every: int | None = 1, seed: int = 0) -> None:
        self.settings = {"dpus": dpu_count(dpus), "numeric": choose(numeric, NUMERICS, "numeric"),
                         "partition": choose(partition, PARTITIONS, "partition"), "scale": fixed_point_scale,
                         "tasklets": tasklets, "sync_every": sync_every, "seed": seed}
        PimSystem(1, 1, 1, tasklets=tasklets, numeric=numeric, scale=fixed_point_scale)  # refuses bad settings now

    def torch_device(self) -> Any:
        raise RlbenchError(TABULAR_ONLY)

    def mlp_inference(self, layer_sizes: Sequence[int], *, hidden_activation: str = "relu",
                      output_activation: str = "identity") -> Any:
        raise RlbenchError(TABULAR_ONLY)

    def tabular(self, n_states: int, n_actions: int) -> "UpmemTabular":
        return UpmemTabular(n_states, n_actions, **self.settings)

    def fingerprint(self) -> dict[str, Any]:
        return fingerprint() | {"settings": dict(self.settings)}


class UpmemTabular:
    """A host-side float64 Q-table (`q`) trained on emulated DPUs."""

    def __init__(self, n_states: int, n_actions: int, *, dpus: int, numeric: str, partition: str, scale: int,
                 tasklets: int, sync_every: int | None, seed: int) -> None:
        self.n_states, self.n_actions = n_states, n_actions
        self.dpus, self.numeric, self.partition, self.scale = dpus, numeric, partition, scale
        self.tasklets, self.sync_every, self.seed = tasklets, sync_every, seed
        DpuBudget(0, n_states * n_actions, tasklets).check()  # a table that cannot fit WRAM is refused now
        self.q = np.zeros((n_states, n_actions), dtype=np.float64)
        self._online: PimSystem | None = None
        self._offline: PimSystem | None = None
        self.report_int32_error = True  # int32 fits re-run the partition in fp32 to report the error

    def _system(self, dpus: int, numeric: str | None = None) -> PimSystem:
        return PimSystem(dpus, self.n_states, self.n_actions, tasklets=self.tasklets,
                         numeric=numeric or self.numeric, scale=self.scale)

    def _offline_system(self, numeric: str) -> PimSystem:
        """The DPU set of offline fits, kept from one fit to the next as a host program keeps its
        dpu_set allocated: later fits scatter into the same MRAM images. One numeric at a time."""
        if self._offline is None or self._offline.numeric != numeric:
            self._offline = None  # frees the other numeric's MRAM before allocating
            self._offline = self._system(self.dpus, numeric)
        return self._offline

    def update(self, batch: Mapping[str, np.ndarray], *, rule: str, alpha: float, gamma: float) -> None:
        check_step(rule, alpha, gamma)
        if rule == "sarsa" and "next_action" not in batch:
            raise RlbenchError("sarsa needs batch['next_action']")
        if self._online is None:
            self._online = self._system(1)
        if self._online.scatter(batch) == 0:  # validated; an empty batch changes nothing
            return
        self.q[...] = self._online.run_round(self.q, rule, alpha, gamma, 1)[0]

    def fit_offline(self, dataset: Mapping[str, np.ndarray], *, rule: str, alpha: float, gamma: float,
                    epochs: int) -> dict[str, Any]:
        from rlbench_upmem.cost_model import predict

        arrays = getattr(dataset, "arrays", dataset)  # an rlbench.datasets.Dataset or its arrays
        start = self.q.copy()
        system = self._offline_system(self.numeric)
        q, measured = run_offline(system, arrays, start, rule=rule, alpha=alpha, gamma=gamma, epochs=epochs,
                                  partition_strategy=self.partition, seed=self.seed, sync_every=self.sync_every)
        chunks = system.chunk_sizes()
        modelled = predict(rule=rule, numeric=self.numeric, scale=self.scale, dpus=self.dpus, tasklets=self.tasklets,
                           chunk_records=int(chunks.max()), total_records=int(chunks.sum()), n_states=self.n_states,
                           n_actions=self.n_actions, epochs=epochs, rounds=measured["rounds"])
        result: dict[str, Any] = {
            "backend": "upmem",
            "settings": {"dpus": self.dpus, "numeric": self.numeric, "partition": self.partition,
                         "tasklets": self.tasklets, "sync_every": self.sync_every,
                         "fixed_point_scale": self.scale if self.numeric == "int32" else None},
            "updates": measured["updates"],
            "unseen_pairs_policy": "a (state, action) no DPU updated keeps its previous host value (0 at start)",
            "emulated": measured,
            "modelled": modelled,
        }
        if self.numeric == "int32" and self.report_int32_error:
            result["int32_error"] = self._int32_error(arrays, start, q, rule=rule, alpha=alpha, gamma=gamma,
                                                      epochs=epochs)
        self.q[...] = q
        return result

    def _int32_error(self, arrays: Mapping[str, np.ndarray], start: np.ndarray, q_int32: np.ndarray, **fit: Any
                     ) -> dict[str, Any]:
        """Re-run the same partition in FP32 and report how far the fixed-point table is from it."""
        system = self._offline_system("fp32")
        q_fp32, _ = run_offline(system, arrays, start, partition_strategy=self.partition, seed=self.seed,
                                sync_every=self.sync_every, **fit)
        error = np.abs(q_int32 - q_fp32)
        return {"kind": "measured", "reference": "the same run in fp32 on the emulator",
                "fixed_point_scale": self.scale, "resolution": 1.0 / self.scale,
                "max_abs": float(error.max()), "mean_abs": float(error.mean()),
                "max_abs_q": float(np.abs(q_fp32).max())}
