"""Registration, probes, refusal before a run, and a cheap plugin import."""

import subprocess
import sys

import pytest
import torch

from rlbench.config import RunConfig
from rlbench.errors import RlbenchError, UnavailableComponentError
from rlbench.plugins import get_registry
from rlbench.validate import validate
from rlbench_gpu.device import GpuError, resolve_device

GPU_COMPONENTS = [("compute", "gpu"), ("replay", "gpu"), ("environment", "gpu/CartPole-v1"),
                  ("environment", "gpu/Pendulum-v1")]


def test_every_component_is_registered_by_the_gpu_plugin():
    registry = get_registry()
    for kind, name in GPU_COMPONENTS:
        component = registry.get(kind, name)
        assert component.plugin == "gpu"
        assert component.capabilities.device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path; this machine has CUDA")
def test_without_cuda_every_component_says_why_and_a_run_is_refused_before_it_starts():
    registry = get_registry()
    for kind, name in GPU_COMPONENTS:
        probe = registry.get(kind, name).probe()
        assert not probe.available
        assert probe.reason.startswith("no CUDA device: ")
        if torch.__version__.endswith("+cpu"):
            assert f"torch {torch.__version__} is a CPU-only build" in probe.reason
    for config in (RunConfig(compute="gpu"), RunConfig(replay="gpu"), RunConfig(env="gpu/CartPole-v1"),
                   RunConfig(algo="ddpg", env="gpu/Pendulum-v1")):
        with pytest.raises(UnavailableComponentError, match="no CUDA device"):
            validate(config, registry)


def test_gpu_compute_refuses_tabular_algorithms_before_the_run():
    with pytest.raises(RlbenchError, match="cannot run the qlearning tabular.*no tabular engine"):
        validate(RunConfig(algo="qlearning", env="FrozenLake-v1", compute="gpu"), get_registry())


def test_importing_the_plugin_module_does_not_import_torch():
    code = "import sys, rlbench_gpu.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("bad", ["tpu", True, "cuda:x", "meta"])
def test_bad_devices_are_refused_in_one_line(bad):
    with pytest.raises(GpuError) as error:
        resolve_device(bad)
    assert "\n" not in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_a_cuda_device_without_cuda_gives_the_probe_reason():
    with pytest.raises(GpuError, match="no CUDA device"):
        resolve_device(0)
    assert resolve_device("cpu") == torch.device("cpu")


def test_gpu_device_option_belongs_to_compute_gpu():
    options = get_registry().options_for("compute", "gpu")
    assert [(o.flag, o.param) for o in options] == [("--gpu-device", "device")]
    with pytest.raises(RlbenchError, match="--gpu-device applies to compute gpu"):
        validate(RunConfig(options={"compute": {"device": 1}}), get_registry())
