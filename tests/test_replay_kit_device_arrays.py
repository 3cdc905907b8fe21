"""The replay conformance kit takes memories whose samples live on a device (issue #22, item 1).

A CUDA tensor refuses numpy (`np.asarray` raises "can't convert cuda:0 device type tensor to
numpy"); the kit must copy to the host itself. `DeviceArray` behaves as such a tensor does, so the
check runs here without a GPU: the old kit failed on it with that TypeError.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlbench import get_registry
from rlbench.protocols import Sample
from rlbench.testing import check_replay_memory


class DeviceArray:
    """What a device tensor offers the host: detach().cpu().numpy() copies; numpy itself is refused."""

    def __init__(self, values: np.ndarray) -> None:
        self._values = np.array(values)
        self.shape, self.dtype = self._values.shape, self._values.dtype
        self.copies = 0

    def __array__(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                        "to host memory first.")

    def __len__(self) -> int:
        return len(self._values)

    def detach(self) -> "DeviceArray":
        return self

    def cpu(self) -> "HostCopy":
        return HostCopy(self._values.copy())


class HostCopy:
    def __init__(self, values: np.ndarray) -> None:
        self._values = values

    def numpy(self) -> np.ndarray:
        return self._values


class SamplesOnTheDevice:
    """A host memory whose samples and indices come back as device arrays, as replay `gpu` hands them out on CUDA."""

    def __init__(self, memory) -> None:
        self.memory, self.capabilities, self.capacity = memory, memory.capabilities, memory.capacity
        self.alpha = getattr(memory, "alpha", None)

    def add(self, transitions, priorities=None):
        return DeviceArray(self.memory.add(transitions, priorities))

    def sample(self, batch_size, beta=0.4):
        sample = self.memory.sample(batch_size, beta)
        return Sample(DeviceArray(sample.indices), {k: DeviceArray(v) for k, v in sample.transitions.items()},
                      DeviceArray(sample.weights))

    def update_priorities(self, indices, priorities):
        return self.memory.update_priorities(indices, priorities)

    def stats(self):
        return self.memory.stats()

    def __len__(self) -> int:
        return len(self.memory)


@pytest.mark.parametrize("name", ["prioritized", "uniform"])
def test_the_kit_checks_a_memory_whose_samples_live_on_a_device(name):
    component = get_registry().get("replay", name)
    report = check_replay_memory(lambda capacity, **options: SamplesOnTheDevice(
        component.create(capacity=capacity, alpha=0.6, seed=0, **options)))
    assert report["prioritized"] == (name == "prioritized") and min(report["p_values"]) >= 1e-6


def test_the_kit_still_catches_a_wrong_row_behind_device_arrays():
    class WrongRow(SamplesOnTheDevice):
        def sample(self, batch_size, beta=0.4):
            sample = self.memory.sample(batch_size, beta)
            obs = sample.transitions["obs"].copy()
            obs[0] += 1.0  # not the row stored at that index
            return Sample(DeviceArray(sample.indices), {**{k: DeviceArray(v) for k, v in sample.transitions.items()},
                                                        "obs": DeviceArray(obs)}, DeviceArray(sample.weights))

    component = get_registry().get("replay", "prioritized")
    with pytest.raises(AssertionError, match="field 'obs': the row sampled at index"):
        check_replay_memory(lambda capacity: WrongRow(component.create(capacity=capacity, alpha=0.6, seed=0)))
