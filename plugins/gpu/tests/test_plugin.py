"""Registration, probes, refusal before a run, and a cheap plugin import."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from rlbench import RunConfig, get_registry, run
from rlbench.errors import RlbenchError, UnavailableComponentError
from rlbench_gpu import capabilities
from rlbench_gpu.device import GpuError, resolve_device

GPU_COMPONENTS = [("compute", "gpu"), ("replay", "gpu"), ("environment", "gpu/CartPole-v1"),
                  ("environment", "gpu/Pendulum-v1")]


def refused_before_it_starts(**fields):
    """rlbench.run on a configuration that must be refused by validation (a tiny budget, should it not be)."""
    return run(RunConfig(steps=10, eval_episodes=0, **fields))


def test_every_component_is_registered_by_the_gpu_plugin_with_the_declared_capabilities():
    registry = get_registry()
    declared = {("compute", "gpu"): capabilities.COMPUTE_CAPABILITIES, ("replay", "gpu"): capabilities.REPLAY_CAPABILITIES,
                **{("environment", env_id): caps for env_id, caps in capabilities.ENVIRONMENT_CAPABILITIES.items()}}
    assert set(declared) == set(GPU_COMPONENTS)
    for kind, name in GPU_COMPONENTS:
        component = registry.get(kind, name)
        assert component.plugin == "gpu"
        assert component.capabilities is declared[kind, name] and component.capabilities.device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path; this machine has CUDA")
def test_without_cuda_every_component_says_why_and_a_run_is_refused_before_it_starts():
    registry = get_registry()
    for kind, name in GPU_COMPONENTS:
        probe = registry.get(kind, name).probe()
        assert not probe.available
        assert probe.reason.startswith("no CUDA device: ")
        if torch.__version__.endswith("+cpu"):
            assert f"torch {torch.__version__} is a CPU-only build" in probe.reason
    for fields in ({"compute": "gpu"}, {"replay": "gpu"}, {"env": "gpu/CartPole-v1"},
                   {"algo": "ddpg", "env": "gpu/Pendulum-v1"}):
        with pytest.raises(UnavailableComponentError, match="no CUDA device"):
            refused_before_it_starts(**fields)


def test_gpu_compute_refuses_tabular_algorithms_before_the_run():
    with pytest.raises(RlbenchError, match="cannot run the qlearning tabular.*no tabular engine"):
        refused_before_it_starts(algo="qlearning", env="FrozenLake-v1", compute="gpu")


def test_importing_the_plugin_module_does_not_import_torch_nor_do_its_probe_and_fingerprint_without_cuda():
    code = ("import sys, rlbench_gpu.plugin as p; on_import = 'torch' in sys.modules; p.probe(); "
            "fingerprint = p.rlbench_fingerprint(); print(on_import, 'torch' in sys.modules, fingerprint['available'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False"
    if not torch.cuda.is_available():
        assert out[1:] == ["False", "False"]


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


def test_gpu_options_belong_to_compute_gpu():
    options = get_registry().options_for("compute", "gpu")
    assert [(o.flag, o.param) for o in options] == [("--gpu-device", "device"), ("--gpu-capture", "capture")]
    assert options[1].choices == ("graph", "compile", "eager")
    with pytest.raises(RlbenchError, match="--gpu-device applies to compute gpu"):
        refused_before_it_starts(options={"compute": {"device": 1}})
    with pytest.raises(RlbenchError, match="--gpu-capture applies to compute gpu"):
        refused_before_it_starts(options={"compute": {"capture": "eager"}})


def test_components_built_on_the_cpu_device_report_the_declared_capabilities_with_their_device():
    from rlbench_gpu.compute import GpuCompute
    from rlbench_gpu.envs import BatchedCartPole, BatchedPendulum
    from rlbench_gpu.replay import GpuPrioritizedReplay

    for instance, declared in ((GpuCompute("cpu"), capabilities.COMPUTE_CAPABILITIES),
                               (GpuPrioritizedReplay(8, device="cpu"), capabilities.REPLAY_CAPABILITIES)):
        assert instance.capabilities == dataclasses.replace(declared, device="cpu")
    for env in (BatchedCartPole(1, device="cpu"), BatchedPendulum(1, device="cpu")):
        declared = capabilities.ENVIRONMENT_CAPABILITIES[env.spec.id]
        assert (env.spec.max_episode_steps, env.spec.reward_threshold) == (declared.max_episode_steps,
                                                                           declared.reward_threshold)


def test_a_run_with_a_setting_measured_to_fail_is_warned_before_it_starts():
    import warnings

    import rlbench
    from rlbench_gpu.plugin import rlbench_run_configured

    def warned(**fields):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rlbench_run_configured(rlbench.RunConfig(**fields))
        return [str(w.message) for w in caught]

    ddpg_compile = warned(algo="ddpg", compute="gpu", options={"compute": {"capture": "compile"}})
    assert len(ddpg_compile) == 1 and "did not learn under --gpu-capture compile" in ddpg_compile[0]
    assert warned(algo="ddpg", compute="gpu", options={"compute": {"capture": "graph"}}) == []
    assert warned(algo="ddpg", compute="gpu") == []  # graph is the default
    assert warned(algo="dqn", compute="gpu", options={"compute": {"capture": "compile"}}) == []  # learned
    assert warned(algo="ddpg", compute="cpu") == []
