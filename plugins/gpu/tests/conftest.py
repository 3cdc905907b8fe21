"""The one place the gpu plugin's tests reach past the core's public surface: running the core's
loops on component instances built on torch's CPU device. `rlbench.run` builds the registered
components, which run on CUDA only (their probe refuses without it), and no public call runs a
configuration on instances a test built; with CUDA, tests/test_cuda.py goes through `rlbench.run`.

`registered_on_the_cpu_device` goes one step further for the runner's own path: it makes the
registered gpu components build CPU-device instances while still declaring CUDA, as a machine
with a GPU would see them, so `rlbench.run` selects and runs what it runs on CUDA.
`on_the_meta_device` builds the plugin's components and the core's learners on torch's meta device
(tensors with no data: a read of a value or a host tensor meeting a device tensor raises)."""

import pytest


def _context(steps, algorithm, hp, env, replay, compute):
    import rlbench
    from rlbench.runtime.context import Budget, RunContext

    config = rlbench.RunConfig(num_envs=env.spec.num_envs, steps=steps, seed=0)
    return RunContext(config=config, algorithm=algorithm, hp=hp, env=env, compute=compute, replay=replay,
                      budget=Budget(total_steps=steps), replay_capabilities=replay.capabilities)


@pytest.fixture
def core_replay_loop():
    """core_replay_loop(algorithm, hp, env, replay, compute, steps) -> (loop context, loop stats)."""
    from rlbench.runtime.local import run_replay_loop

    def run(algorithm, hp, env, replay, compute, steps):
        ctx = _context(steps, algorithm, hp, env, replay, compute)
        return ctx, run_replay_loop(ctx)

    return run


@pytest.fixture
def one_device_loop():
    """one_device_loop(algorithm, hp, env, replay, compute, steps) -> (loop context, loop stats):
    rlbench/runtime/device_loop.py, the loop the runner selects when everything is on one GPU."""
    from rlbench.runtime.device_loop import run_device_loop

    def run(algorithm, hp, env, replay, compute, steps):
        ctx = _context(steps, algorithm, hp, env, replay, compute)
        return ctx, run_device_loop(ctx)

    return run


@pytest.fixture
def registered_on_the_cpu_device(monkeypatch):
    """The registered gpu components build CPU-device instances (capabilities still say CUDA)."""
    from rlbench import get_registry
    from rlbench.protocols import Probe
    from rlbench_gpu.compute import GpuCompute
    from rlbench_gpu.envs import make
    from rlbench_gpu.replay import GpuPrioritizedReplay

    registry = get_registry()
    factories = {("compute", "gpu"): lambda device=0, **options: GpuCompute("cpu", **options),
                 ("replay", "gpu"): lambda capacity, **options: GpuPrioritizedReplay(capacity, **options,
                                                                                    device="cpu")}
    for env_id in ("gpu/CartPole-v1", "gpu/Pendulum-v1"):
        factories["environment", env_id] = (lambda env_id: lambda num_envs=1, *, seed=None, **options: make(
            env_id, num_envs, seed=seed, device="cpu", output="torch", **options))(env_id)
    for (kind, name), factory in factories.items():
        component = registry.get(kind, name)
        monkeypatch.setattr(component, "factory", factory)
        monkeypatch.setattr(component, "_probe", Probe.ok("test: CPU-device instances"))
    return registry


@pytest.fixture
def on_the_meta_device(monkeypatch):
    """The gpu components resolve every device to meta; torch refuses fused and capturable Adam on
    meta, so the learners' capturable Adam becomes an SGD step (Adam's own step is audited on the CPU
    device); device generators become host ones (draws on meta need no state)."""
    import torch

    import rlbench.algorithms.networks as networks
    import rlbench_gpu.envs as envs
    import rlbench_gpu.replay as replay

    meta, real_generator = torch.device("meta"), torch.Generator

    class HostGenerator:  # a class, not a function: torch's own modules annotate with `torch.Generator | None`
        def __new__(cls, device=None):
            return real_generator()

    monkeypatch.setattr(envs, "resolve_device", lambda device: meta)
    monkeypatch.setattr(replay, "resolve_device", lambda device: meta)
    monkeypatch.setattr(torch, "Generator", HostGenerator)
    monkeypatch.setattr(networks, "capturable_adam", lambda params, lr: torch.optim.SGD(params, lr=lr))
    return meta
