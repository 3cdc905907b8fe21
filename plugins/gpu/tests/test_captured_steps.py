"""What the one-device loop captures (issue #22 items 2, 3 and 5), checked without a GPU.

On the CPU device: the learner's K-update launch and the env chunk dispatch no host round trip
(no `.item()`/`.tolist()`/`.cpu()`/`bool()` on a device value, no op whose output shape or value
must be read back, no tensor made from host data) and stay within a stated number of computing
ops per update or step (each about one kernel launch on CUDA); K fused updates leave the same
parameters and priorities as K single updates; an env chunk makes the transitions of S single
steps. On the meta device (a device with no host data at all), the same code runs end to end, so
no host tensor meets a device tensor inside it. The CUDA graphs themselves need CUDA
(test_cuda.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlbench import get_registry
from rlbench.errors import RlbenchError
from rlbench_gpu.audit import HostRoundTripAudit
from rlbench_gpu.compute import GpuCompute
from rlbench_gpu.envs import BatchedCartPole, BatchedPendulum
from rlbench_gpu.replay import GpuPrioritizedReplay

ENVS = {"dqn": BatchedCartPole, "ddpg": BatchedPendulum}
# Computing ops (neither views nor profiler markers: on CUDA about one kernel each), measured on
# torch 2.13 with batch 128 and 128-128 networks: DQN 138 per update (draw 30 + learn 66 + target
# 4 + set_priorities 38), DDPG 147 per update over a launch of 8 (an actor step every 2nd), an env
# step 94 (CartPole) / 90 (Pendulum) with exploration, the replay write and the episode record.
# About 10 % headroom: more means more launches per step, which is what this work removes.
KERNEL_OPS_PER_UPDATE = {"dqn": 152, "ddpg": 162}
KERNEL_OPS_PER_ENV_STEP = 104
K = 8
TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # fused vs single: the same kernels, so equal to float32 rounding


def algorithm(name):
    return get_registry().get("algorithm", name).create()


def filled(name, *, seed=0, num_envs=64, steps=40, device="cpu", **hp):
    """(learner ready to capture, replay filled by a rollout of its own exploring policy, env)."""
    algo = algorithm(name)
    config = algo.Config(batch_size=128, **hp)
    env = ENVS[name](num_envs, seed=seed, device=device, output="torch")
    replay = GpuPrioritizedReplay(4096, seed=seed, device=device)
    learner = algo.make_learner(env.spec, Compute(device), config, seed)
    learner.prepare_capture(seed)
    env.reset(seed=seed)
    env_step = torch.full((), 5000, dtype=torch.int64, device=env.device)  # past DDPG's uniform warm-up
    env.rollout(steps, lambda obs: learner.explore(obs, env_step), writer(replay))
    replay.count_captured(added=steps * num_envs)
    return learner, replay, env


class Compute:
    def __init__(self, device):
        self.device = torch.device(device)

    def torch_device(self):
        return self.device


def writer(replay, also=None):
    def record(obs, actions, rewards, final_obs, terminated, truncated):
        replay.write({"obs": obs, "action": actions, "reward": rewards, "next_obs": final_obs,
                      "done": terminated.to(torch.float32)})
        if also is not None:
            also.append(tuple(t.clone() for t in (obs, actions, rewards, final_obs, terminated, truncated)))
    return record


def parameters(learner):
    networks = ("q_network", "target_network") if hasattr(learner, "q_network") else \
        ("actor", "critic", "target_actor", "target_critic")
    return {f"{n}.{k}": v.detach().clone() for n in networks for k, v in getattr(learner, n).state_dict().items()}


# ------------------------------------------------------------------------------ no host round trip
@pytest.mark.parametrize("name", ["dqn", "ddpg"])
def test_a_learner_launch_never_waits_for_the_host_and_keeps_to_its_op_budget(name):
    learner, replay, _ = filled(name)
    beta = torch.full((), 0.4, dtype=torch.float64)
    learner.device_updates(replay, K, beta)  # optimizer state exists, as after a capture's warm-up
    with HostRoundTripAudit() as audit:
        learner.device_updates(replay, K, beta)
    assert audit.round_trips == []
    assert audit.kernel_ops / K <= KERNEL_OPS_PER_UPDATE[name], audit.ops.most_common(12)
    replay.check_flags()  # and every captured call was valid


@pytest.mark.parametrize("name", ["dqn", "ddpg"])
def test_an_env_chunk_never_waits_for_the_host_and_keeps_to_its_op_budget(name):
    learner, replay, env = filled(name, steps=2)
    env_step = torch.zeros((), dtype=torch.int64)
    with HostRoundTripAudit() as audit:
        env.rollout(4, lambda obs: learner.explore(obs, env_step), writer(replay))
    assert audit.round_trips == []
    assert audit.kernel_ops / 4 <= KERNEL_OPS_PER_ENV_STEP, audit.ops.most_common(12)


def test_the_audit_catches_each_kind_of_host_round_trip():
    replay = GpuPrioritizedReplay(64, seed=0, device="cpu")
    replay.add({"obs": torch.zeros((8, 4))}, torch.ones(8))
    t = torch.rand(8)
    cases = {"item": lambda: t[0].item(), "tolist": lambda: t.tolist(), "cpu": lambda: t.cpu(),
             "bool": lambda: bool(t[0] > 0), "mask": lambda: t[t > 0.5], "nonzero": lambda: t.nonzero(),
             "host constant": lambda: torch.tensor([1.0, 2.0]),
             # replay gpu's uncaptured update checks device tensors in one sync
             "update_priorities": lambda: replay.update_priorities(torch.arange(4), torch.ones(4))}
    for what, call in cases.items():
        with HostRoundTripAudit() as audit:
            call()
        assert audit.round_trips, f"{what} went unnoticed"
    with HostRoundTripAudit() as audit:
        t[torch.arange(3)] = t[torch.arange(3)] * 2  # integer indexing: static shapes, no sync
    assert audit.round_trips == [] and audit.kernel_ops > 0


def test_a_pendulum_reset_makes_no_host_tensor():
    # The CUDA failure of the measurements: a reset constant built from host values inside the step.
    env = BatchedPendulum(8, seed=0, device="cpu", output="torch")
    env.reset()
    env.set_state(np.zeros((8, 2)), elapsed=199)  # every row truncates: the step re-draws all of them
    with HostRoundTripAudit() as audit:
        env.step(torch.zeros((8, 1)))
    assert audit.round_trips == []


@pytest.mark.parametrize("name", ["dqn", "ddpg"])
def test_the_captured_code_runs_on_a_device_without_host_data(name, on_the_meta_device):
    """On torch's meta device every tensor is on "the device" and none has data: a host tensor that
    meets a device tensor, a read of a value or a copy to the host raises (an SGD step stands in for
    Adam, which torch refuses on meta; Adam's fused step is audited above)."""
    meta = on_the_meta_device
    learner, replay, env = filled(name, num_envs=16, steps=3, device="meta")
    with HostRoundTripAudit() as audit:
        env.rollout(2, lambda obs: learner.explore(obs, torch.zeros((), dtype=torch.int64, device=meta)),
                    writer(replay))
        learner.device_updates(replay, 2, torch.zeros((), dtype=torch.float64, device=meta))
    assert audit.round_trips == [] and audit.kernel_ops > 200
    assert all(p.device.type == "meta" for p in parameters(learner).values())
    with pytest.raises(RuntimeError):  # what this device catches: a host tensor meeting a device one
        env.state + torch.ones(env.state.shape)
    with pytest.raises(NotImplementedError):  # and a copy to the host
        env.state.cpu()


# ------------------------------------------------------------------------------ the same results
@pytest.mark.parametrize("name, hp", [("dqn", {"target_update_every": 3}), ("ddpg", {"policy_delay": 2})])
def test_k_fused_updates_equal_k_single_updates(name, hp):
    single, single_replay, _ = filled(name, **hp)
    fused, fused_replay, _ = filled(name, **hp)
    for before_a, before_b in zip(parameters(single).values(), parameters(fused).values()):
        assert torch.equal(before_a, before_b)
    start = parameters(fused)
    for _ in range(K):
        sample = single_replay.sample(128, 0.4)
        priorities, _ = single.update(sample)
        single_replay.update_priorities(sample.indices, priorities)
    fused.device_updates(fused_replay, K, torch.full((), 0.4, dtype=torch.float64))
    fused_replay.check_flags()
    after_single, after_fused = parameters(single), parameters(fused)
    for key in after_single:
        torch.testing.assert_close(after_fused[key], after_single[key], **TOLERANCE, msg=key)
    moved = [key for key in start if not torch.equal(start[key], after_fused[key])]
    assert any(k.startswith("target") for k in moved) and any(not k.startswith("target") for k in moved)
    np.testing.assert_allclose(fused_replay.priorities(np.arange(4096)), single_replay.priorities(np.arange(4096)),
                               **TOLERANCE)
    assert fused_replay.stats()["max_priority_seen"] == pytest.approx(single_replay.stats()["max_priority_seen"],
                                                                      rel=1e-5)


@pytest.mark.parametrize("env_class, actions", [
    (BatchedCartPole, lambda rng, n: torch.from_numpy(rng.integers(0, 2, n))),
    (BatchedPendulum, lambda rng, n: torch.from_numpy(rng.uniform(-2, 2, (n, 1)).astype(np.float32)))])
def test_an_env_chunk_makes_the_transitions_of_single_steps(env_class, actions):
    steps, n = 30, 32
    rng = np.random.default_rng(0)
    planned = [actions(rng, n) for _ in range(steps)]
    chunked, single = env_class(n, seed=3, device="cpu", output="torch"), env_class(n, seed=3, device="cpu", output="torch")
    cartpole = env_class is BatchedCartPole
    states = rng.uniform(-0.05, 0.05, (n, 4)) if cartpole else rng.uniform(-3, 3, (n, 2))
    for env in (chunked, single):  # near the time limit: episodes end and reset inside the chunk
        env.reset()
        env.set_state(states, elapsed=490 if cartpole else 190)
    chunk, step = [], iter(range(steps))
    chunked.rollout(steps, lambda obs: planned[next(step)], lambda *t: chunk.append([x.clone() for x in t]))
    obs = single._observe(single.state)
    for s in range(steps):
        result = single.step(planned[s])
        expected = [obs, planned[s], result.rewards, result.final_observations, result.terminated, result.truncated]
        for got, want in zip(chunk[s], expected):
            assert torch.equal(got, want), f"step {s}"
        obs = result.observations
    assert any(bool(t[5].any()) for t in chunk), "no episode was truncated inside the chunk"
    assert torch.equal(chunked.state, single.state) and torch.equal(chunked.elapsed, single.elapsed)


# ------------------------------------------------------------------------------ replay's captured calls
def test_captured_replay_calls_raise_flags_that_one_check_reads():
    replay = GpuPrioritizedReplay(64, seed=0, device="cpu")
    rows = {"obs": torch.arange(40, dtype=torch.float32).view(10, 4), "action": torch.arange(10)}
    replay.write(rows)
    replay.count_captured(added=10)
    assert len(replay) == 10 and replay.stats()["adds"] == 10
    sample = replay.draw(32, torch.full((), 0.5, dtype=torch.float64))
    assert torch.equal(sample.transitions["action"], sample.indices)  # each row is the one stored at its index
    replay.set_priorities(torch.tensor([1, 2]), torch.tensor([float("nan"), 1.0]))
    replay.set_priorities(torch.tensor([12]), torch.tensor([1.0]))  # only 10 items stored
    with pytest.raises(RlbenchError, match="an index out of range.*a priority that is negative or not finite"):
        replay.check_flags()
    replay.check_flags()  # read and cleared
    assert np.isfinite(replay.stats()["total_priority"])
    replay.set_priorities(torch.arange(10), torch.zeros(10))
    replay.draw(4, torch.zeros((), dtype=torch.float64))
    with pytest.raises(RlbenchError, match="every priority is zero"):
        replay.check_flags()
    with pytest.raises(RlbenchError, match="every stored priority is zero"):
        replay.sample(4)  # the host path learnt of the zeros from the flags


def test_a_captured_write_continues_where_add_stopped_and_wraps():
    replay = GpuPrioritizedReplay(8, seed=0, device="cpu")
    replay.add({"action": torch.arange(5)})
    replay.write({"action": torch.arange(5, 11)})
    replay.count_captured(added=6)
    assert len(replay) == 8 and replay.add({"action": torch.tensor([11])}).tolist() == [3]
    stored = set(replay.sample(400).transitions["action"].tolist())
    assert stored == set(range(4, 12))  # 0..3 overwritten by 8..11, in FIFO order


def test_capture_modes_and_the_cpu_device():
    with pytest.raises(RlbenchError, match="capture must be one of"):
        GpuCompute("cpu", capture="jit")
    calls = []
    launch = GpuCompute("cpu", capture="graph").capture(lambda: calls.append(1))
    for _ in range(4):
        launch()
    assert len(calls) == 4 and launch.mode == "eager" and "CPU device" in launch.describe()


def test_ddpg_refuses_launches_that_split_its_policy_delay():
    learner, _, _ = filled("ddpg", policy_delay=2, steps=1)
    assert learner.launch_refusal(8) is None
    assert "multiple of policy_delay (2)" in learner.launch_refusal(7)
    with pytest.raises(RlbenchError, match="before the learner's first update"):
        learner.updates = 1
        learner.prepare_capture(0)
