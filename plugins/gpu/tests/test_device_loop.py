"""The one-device loop (rlbench/runtime/device_loop.py, issue #22 item 4) on the CPU device: the
same accounting, env steps and updates as the local loop, the runner choosing it exactly when env,
replay and compute are all on one accelerator, and saying which loop ran."""

from __future__ import annotations

import math

import pytest

import rlbench
from rlbench import get_registry
from rlbench.errors import RlbenchError
from rlbench_gpu.compute import GpuCompute
from rlbench_gpu.envs import BatchedCartPole, BatchedPendulum
from rlbench_gpu.replay import GpuPrioritizedReplay

SHORT = dict(learning_starts=256, batch_size=32, train_every=4, buffer_size=4096)


def algorithm(name):
    return get_registry().get("algorithm", name).create()


def components(name, num_envs, seed=0):
    env_class = BatchedCartPole if name == "dqn" else BatchedPendulum
    return (env_class(num_envs, seed=seed, device="cpu", output="torch"),
            GpuPrioritizedReplay(4096, seed=seed, device="cpu"), GpuCompute("cpu"))


@pytest.mark.parametrize("name, num_envs, steps, per_launch", [("dqn", 16, 1500, 8), ("ddpg", 8, 1000, 4)])
def test_the_device_loop_makes_the_local_loops_steps_and_updates(name, num_envs, steps, per_launch, one_device_loop,
                                                                 core_replay_loop):
    algo = algorithm(name)
    hp = algo.Config(**SHORT, updates_per_launch=per_launch, env_steps_per_launch=8)
    ctx, stats = one_device_loop(algo, hp, *components(name, num_envs), steps)
    local_ctx, local = core_replay_loop(algo, algo.Config(**SHORT), *components(name, num_envs), steps)
    assert stats.env_steps == local.env_steps == math.ceil(steps / num_envs) * num_envs
    assert stats.updates == local.updates == (stats.env_steps - 256) // 4 + 1
    assert ctx.accounting.to_dict() == local_ctx.accounting.to_dict() and ctx.accounting.to_dict()["balanced"]
    memory = ctx.replay.stats()
    assert memory["size"] == len(ctx.replay) == min(stats.env_steps, 4096) and memory["adds"] == stats.env_steps
    assert memory["samples"] == memory["updates"] == stats.updates
    launches, uncaptured = stats.extra["launches"], stats.extra["uncaptured"]
    assert launches["learner"] * per_launch + uncaptured["updates"] == stats.updates
    assert launches["env"] * 8 * num_envs + uncaptured["env_steps"] == stats.env_steps
    assert 0 < uncaptured["env_steps"] < 8 * num_envs  # the budget ended inside a launch: the rest ran uncaptured
    assert ctx.actor is not None and ctx.actor.q_values.version if name == "dqn" else ctx.actor.policy.version


def test_the_device_loop_records_every_episode_where_it_ended(one_device_loop):
    dqn = algorithm("dqn")
    hp = dqn.Config(**{**SHORT, "train_every": 32}, env_steps_per_launch=16)
    ctx, stats = one_device_loop(dqn, hp, *components("dqn", 16), 4096)
    points = ctx.curve.points
    assert len(points) > 50
    assert all(p["return"] == p["length"] and 1 <= p["length"] <= 500 for p in points)  # CartPole: 1 per step
    assert all(p["step"] % 16 == 0 and 0 < p["step"] <= stats.env_steps for p in points)
    assert [p["step"] for p in points] == sorted(p["step"] for p in points)
    # every env's episodes add up to the steps it took, less its running episode
    assert sum(p["length"] for p in points) <= stats.env_steps
    assert sum(p["length"] for p in points) > stats.env_steps - 16 * 500


def test_the_device_loop_refuses_hyperparameters_it_cannot_launch(one_device_loop):
    ddpg = algorithm("ddpg")
    with pytest.raises(RlbenchError, match="multiple of policy_delay"):
        one_device_loop(ddpg, ddpg.Config(**SHORT, updates_per_launch=5), *components("ddpg", 4), 512)
    dqn = algorithm("dqn")
    with pytest.raises(RlbenchError, match="must be at least 1"):
        one_device_loop(dqn, dqn.Config(**SHORT, env_steps_per_launch=0), *components("dqn", 4), 512)


def test_the_refusal_names_what_keeps_a_run_off_one_device(one_device_loop):
    from rlbench.runtime.device_loop import refusal

    dqn = algorithm("dqn")
    env, replay, compute = components("dqn", 4)
    ctx, _ = one_device_loop(dqn, dqn.Config(**SHORT), env, replay, compute, 64)
    cuda = {"environment": "cuda", "replay memory": "cuda", "compute": "cuda"}
    assert refusal(ctx, cuda) is None
    assert "compute cpu" in refusal(ctx, {**cuda, "compute": "cpu"})
    assert "replay memory none" in refusal(ctx, {**cuda, "replay memory": None})
    ctx.replay = get_registry().get("replay", "prioritized").create(capacity=64, alpha=0.6, seed=0)
    assert "offers no write, draw" in refusal(ctx, cuda)
    ctx.algorithm = get_registry().get("algorithm", "qlearning").create()
    assert "offers no captured learner" in refusal(ctx, cuda)


# ------------------------------------------------------------------------------------ through rlbench.run
def run(env, replay, compute, algo="dqn", **hp):
    return rlbench.run(rlbench.RunConfig(algo=algo, env=env, replay=replay, compute=compute, num_envs=8, steps=1024,
                                         seed=0, eval_episodes=1, hyperparameters={**SHORT, **hp}))


def test_the_runner_runs_the_device_loop_when_everything_is_on_one_gpu(registered_on_the_cpu_device):
    result = run("gpu/CartPole-v1", "gpu", "gpu")
    loop = result["loop"]
    assert loop["name"] == "device" and loop["updates_per_launch"] == 8 and loop["env_steps_per_launch"] == 16
    assert result["status"] == "complete" and result["accounting"]["balanced"]
    assert result["throughput"]["env_steps"] == 1024 and result["throughput"]["updates"] == (1024 - 256) // 4 + 1
    assert result["evaluation"]["episodes"] == 1 and result["learning_curve"]
    assert result["replay_stats"]["samples"] == result["throughput"]["updates"]
    assert result["latency"]["env.launch"]["count"] == 1024 // (8 * 16)


def test_the_runner_keeps_the_local_loop_for_any_other_combination(registered_on_the_cpu_device):
    mixed = run("CartPole-v1", "gpu", "gpu")
    assert mixed["loop"]["name"] == "replay"
    assert "environment cpu" in mixed["loop"]["device_loop_not_chosen"]
    host = run("CartPole-v1", "prioritized", "cpu")
    assert host["loop"]["name"] == "replay" and "device_loop_not_chosen" not in host["loop"]
    ddpg = run("gpu/Pendulum-v1", "gpu", "gpu", algo="ddpg")
    assert ddpg["loop"]["name"] == "device" and ddpg["accounting"]["balanced"]
