"""The one place the gpu plugin's tests reach past the core's public surface: running the core's
replay loop on component instances built on torch's CPU device. `rlbench.run` builds the registered
components, which run on CUDA only (their probe refuses without it), and no public call runs a
configuration on instances a test built; with CUDA, tests/test_cuda.py goes through `rlbench.run`."""

import pytest


@pytest.fixture
def core_replay_loop():
    """core_replay_loop(algorithm, hp, env, replay, compute, steps) -> (loop context, loop stats)."""
    import rlbench
    from rlbench.runtime.context import Budget, RunContext
    from rlbench.runtime.local import run_replay_loop

    def run(algorithm, hp, env, replay, compute, steps):
        config = rlbench.RunConfig(num_envs=env.spec.num_envs, steps=steps, seed=0)
        ctx = RunContext(config=config, algorithm=algorithm, hp=hp, env=env, compute=compute, replay=replay,
                         budget=Budget(total_steps=steps), replay_capabilities=replay.capabilities)
        return ctx, run_replay_loop(ctx)

    return run
