"""Issue #24 item 3: checkpoints of a distributed run (the learner and the replay node, atomically)
and `rlbench run --resume DIR`, down to a run SIGKILLed mid-way and resumed to its step count; and
issue #39's: the same with Atari frames in a memory that stores each frame once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from support import killed_mid_way, run_cli
from rlbench.builtin.replay import PrioritizedReplay, UniformReplay
from rlbench.config import RunConfig
from rlbench.errors import RlbenchError
from rlbench.runtime import checkpoint
from rlbench.runtime.checkpoint import CheckpointError

SHORT = {"learning_starts": 200, "batch_size": 32}


def transitions(n: int, start: int = 0) -> dict[str, np.ndarray]:
    rows = np.arange(start, start + n)
    return {"obs": np.stack([rows, -rows], 1).astype(np.float32), "action": rows % 2,
            "reward": rows.astype(np.float32), "next_obs": np.stack([rows + 1, -rows], 1).astype(np.float32),
            "done": (rows % 7 == 0).astype(np.float32)}


def filled(memory, rounds: int = 5):
    for i in range(rounds):  # more than the capacity: the ring has wrapped
        memory.add(transitions(40, 40 * i))
        if hasattr(memory, "priorities"):
            sample = memory.sample(16, 0.5)
            memory.update_priorities(sample.indices, np.linspace(0.1, 3.0, 16) + i)
    return memory


# ------------------------------------------------------------------------------------ the memories
@pytest.mark.parametrize("kind", [UniformReplay, PrioritizedReplay])
def test_a_restored_memory_stores_and_samples_what_the_saved_one_would(kind, tmp_path):
    saved = filled(kind(150, alpha=0.6, seed=3))
    restored = kind(150, alpha=0.6, seed=99)  # another seed: the generator's state comes from the checkpoint
    state = saved.state_dict()
    restored.load_state_dict(state)
    assert len(restored) == len(saved) == 150
    for memory in (saved, restored):  # the same next add lands in the same slots
        memory.add(transitions(10, 1000))
    a, b = saved.sample(64, 0.4), restored.sample(64, 0.4)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_allclose(a.weights, b.weights, rtol=1e-5)
    for name in a.transitions:
        np.testing.assert_array_equal(a.transitions[name], b.transitions[name])
    assert saved.stats()["adds"] == restored.stats()["adds"]
    if kind is PrioritizedReplay:
        indices = np.arange(150)
        np.testing.assert_allclose(restored.priorities(indices), saved.priorities(indices), rtol=1e-6)
        assert restored.stats()["max_priority_seen"] == pytest.approx(saved.stats()["max_priority_seen"])


def test_a_memory_of_another_capacity_refuses_the_checkpoint():
    from rlbench.kit.replay import ReplayError

    with pytest.raises(ReplayError, match="capacity 150 does not fit a memory of 100"):
        UniformReplay(100).load_state_dict(filled(UniformReplay(150)).state_dict())


# ------------------------------------------------------------------------------------ the learner
@pytest.mark.parametrize("algo, env", [("dqn", "CartPole-v1"), ("ddpg", "Pendulum-v1")])
def test_a_restored_learner_makes_the_same_next_updates(algo, env, tmp_path):
    from rlbench.plugins import get_registry
    from rlbench.protocols import Sample
    from rlbench.config import apply_overrides

    registry = get_registry()
    algorithm = registry.get("algorithm", algo).create()
    hp = apply_overrides(algorithm.Config, {"batch_size": 16})
    environment = registry.get("environment", env).create(num_envs=1, seed=0)
    spec = environment.spec
    environment.close()
    compute = registry.get("compute", "cpu").create()
    rng = np.random.default_rng(0)

    def batch() -> Sample:
        obs = rng.normal(size=(16, *spec.observation_shape)).astype(np.float32)
        action = (rng.integers(0, spec.n_actions, 16) if spec.n_actions else
                  rng.uniform(-1, 1, (16, *spec.action_shape)).astype(np.float32))
        return Sample(np.arange(16), {"obs": obs, "action": action, "reward": rng.normal(size=16).astype(np.float32),
                                      "next_obs": obs + 0.1, "done": np.zeros(16, np.float32)}, np.ones(16, np.float32))

    first = algorithm.make_learner(spec, compute, hp, seed=1)
    for _ in range(5):
        first.update(batch())
    checkpoint.save_learner(tmp_path, 1, first)
    second = algorithm.make_learner(spec, compute, hp, seed=2)  # other initial weights: all come from the file
    checkpoint.load_learner(checkpoint.folder(tmp_path, 1), second)
    assert second.updates == first.updates == 5
    for _ in range(4):  # Adam's moments, the target networks and the update count all matter here
        sample = batch()
        p1, _ = first.update(sample)
        p2, _ = second.update(sample)
        np.testing.assert_array_equal(np.asarray(p1), np.asarray(p2))
    for w1, w2 in zip(first.weights(), second.weights()):
        np.testing.assert_array_equal(w1, w2)


# ------------------------------------------------------------------------------------ the folder
def test_latest_moves_only_when_every_part_is_whole_and_old_checkpoints_go(tmp_path):
    class Learner:
        updates = 3

        def state_dict(self):
            return {"updates": self.updates}

    memory = filled(PrioritizedReplay(100, seed=0), 2)
    state = {"produced": 80, "learner_updates": 3, "params": {}}
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        checkpoint.latest(tmp_path)
    with pytest.raises(CheckpointError, match="shared filesystem"):  # the learner's part is not there
        checkpoint.save_replay(tmp_path, 1, 0, state, memory)
    for number in (1, 2, 3):
        checkpoint.save_learner(tmp_path, number, Learner())
        for shard in (0, 1):
            checkpoint.save_replay(tmp_path, number, shard, {**state, "produced": 80 * number}, memory)
        checkpoint.commit(tmp_path, number, 2, {"env_steps": 160 * number, "learner_updates": 3})
    checkpoint.save_learner(tmp_path, 4, Learner())  # killed here: shard 1 never wrote its part of 4
    checkpoint.save_replay(tmp_path, 4, 0, state, memory)
    with pytest.raises(CheckpointError, match="not whole.*replay-1.npz is missing"):
        checkpoint.commit(tmp_path, 4, 2, {"env_steps": 0, "learner_updates": 3})
    newest = checkpoint.latest(tmp_path)
    assert newest["number"] == 3 and newest["env_steps"] == 480 and newest["path"].endswith("ckpt-000003")
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-000002", "ckpt-000003", "ckpt-000004"]
    assert not list(tmp_path.rglob("*.tmp"))
    restored = PrioritizedReplay(100, seed=5)
    node = checkpoint.load_replay(newest["path"], restored, shard=1)
    assert node["produced"] == 240 and len(restored) == len(memory)


def test_checkpoints_are_refused_where_a_run_cannot_keep_them(tmp_path):
    from rlbench.plugins import get_registry
    from rlbench.runner import check, run

    def refused(match: str, **kw):
        with pytest.raises(RlbenchError, match=match):
            check(RunConfig(**kw), get_registry())

    refused("placement local has neither", checkpoint_every=5.0)
    refused("positive number of seconds", checkpoint_every=-1.0, placement="server", transport="tcp")
    refused("--checkpoint-dir says where --checkpoint-every writes", checkpoint_dir=str(tmp_path))
    refused("replay memory memmap cannot be checkpointed.*that can: uniform, prioritized", replay="memmap",
            checkpoint_every=5.0, placement="server", transport="tcp")
    refused("--resume checkpoints a distributed run", resume=str(tmp_path))
    other = tmp_path / "other"
    checkpoint.write_manifest(other, RunConfig(placement="server", transport="tcp", checkpoint_every=1.0).to_dict(), 100, 0)
    with pytest.raises(CheckpointError, match="holds another run's checkpoints.*--resume"):
        run(RunConfig(placement="server", transport="tcp", checkpoint_every=1.0, checkpoint_dir=str(other), out=None))
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        run(checkpoint.resumed_config(other))
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        checkpoint.resumed_config(tmp_path / "nothing")
    said = run_cli("run", "--resume", str(other), "--algo", "ddpg", "--no-out")
    assert said.returncode == 2 and "--algo: --resume continues the run" in said.stderr


# ------------------------------------------------------------------------------------ kill, resume
def test_a_run_sigkilled_mid_way_resumes_from_its_checkpoint_and_finishes_with_exact_accounting(tmp_path):
    directory = tmp_path / "ckpt"
    steps = 6000
    record = killed_mid_way(directory, "--placement", "server", "--transport", "tcp", "--actors", "2",
                            "--steps", str(steps), "--hp", "learning_starts=200", "--hp", "batch_size=32",
                            "--checkpoint-every", "0.3", at_env_steps=2000)
    said = run_cli("run", "--resume", str(directory), "--json", "--no-out", timeout=180)
    assert said.returncode == 0, said.stderr[-3000:]
    result = json.loads(said.stdout)
    assert result["status"] == "complete", result["status_reason"]
    resumed = result["resumed_from"]
    assert resumed["checkpoint"] == Path(record["path"]).name and resumed["resumes"] == 1
    assert resumed["env_steps"] == record["env_steps"] >= 2000
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["dropped"] == 0
    # the budget, and at most what each actor had in flight and its last chunk past it
    assert steps <= accounting["produced"] <= steps + 2 * 2 * 128
    assert resumed["env_steps"] + result["throughput"]["env_steps"] == accounting["produced"]
    # the actors go on from the checkpoint's step: exploration (epsilon_at of that step) and the curve
    roles = result["loop"]["roles"]
    started = [roles[f"actor-{index}"]["started_at_step"] for index in range(2)]
    assert all(resumed["env_steps"] <= step <= resumed["env_steps"] + 2 * 128 for step in started), started
    assert result["learning_curve"] and min(point["step"] for point in result["learning_curve"]) > resumed["env_steps"]
    learner = result["loop"]["roles"]["learner"]
    assert learner["updates_total"] == resumed["learner_updates"] + learner["updates"]
    assert result["config"]["steps"] == steps and result["config"]["actors"] == 2  # the run as it was configured
    assert result["checkpoints"]["directory"] == str(directory) and result["checkpoints"]["written"]
    assert result["checkpoints"]["written"][0]["number"] == int(resumed["checkpoint"][5:]) + 1
    manifest = checkpoint.read_manifest(directory)
    assert manifest["resumes"] == 1 and manifest["total_steps"] == steps


# ------------------------------------------------------------------------------- an image run's
def stored_rows(path: Path) -> dict[str, np.ndarray]:
    """Every transition a replay node's checkpoint file holds, its stacks rebuilt from its frames."""
    from rlbench.kit.frames import unpack

    with np.load(path) as saved:
        size = json.loads(bytes(saved["meta"]).decode())["memory"]["size"]
        obs, next_obs = unpack(saved["memory.frames"], saved["memory.frame_ids.obs"],
                               saved["memory.frame_ids.next_obs"])
        rows = {name: saved[f"memory.column.{name}"][:size] for name in ("action", "reward", "done")}
        rows.update(obs=obs, next_obs=next_obs, frames=np.asarray(saved["memory.frames"]))
    assert len(obs) == size
    return rows


def test_an_atari_run_sigkilled_mid_way_resumes_with_its_memory_of_frames_restored_exactly(tmp_path):
    """The run above with Atari frames stacked 4 deep, in a memory that stores each frame once (its
    checkpoint holds each live frame once and each transition's frame ids)."""
    import shutil

    from rlbench.plugins import get_registry

    probe = get_registry().get("environment", "ALE/Pong-v5").probe()
    if not probe.available:  # the envs extra (ale-py, opencv) is not installed
        pytest.skip(probe.reason)
    directory, steps, capacity = tmp_path / "ckpt", 2000, 4000  # the memory never wraps: restored rows stay put
    hp = [item for key, value in {"learning_starts": 100, "batch_size": 16, "buffer_size": capacity}.items()
          for item in ("--hp", f"{key}={value}")]
    record = killed_mid_way(directory, "--env", "ALE/Pong-v5", "--placement", "server", "--transport", "shm",
                            "--actors", "2", "--steps", str(steps), "--eval-episodes", "0", *hp,
                            "--checkpoint-every", "0.3", at_env_steps=800, timeout=180)
    saved = tmp_path / "saved"  # the resumed run's own checkpoints replace it (two are kept)
    shutil.copytree(record["path"], saved)
    said = run_cli("run", "--resume", str(directory), "--json", "--no-out", timeout=240)
    assert said.returncode == 0, said.stderr[-3000:]
    result = json.loads(said.stdout)
    assert result["status"] == "complete", result["status_reason"]

    # accounting across the resume: the checkpoint's env steps and this run's make the run's count
    resumed, accounting = result["resumed_from"], result["accounting"]
    assert resumed["checkpoint"] == Path(record["path"]).name and resumed["env_steps"] == record["env_steps"] >= 800
    assert accounting["balanced"] and accounting["dropped"] == 0
    assert steps <= accounting["produced"] <= steps + 2 * 2 * 128
    assert resumed["env_steps"] + result["throughput"]["env_steps"] == accounting["produced"] == accounting["stored"]
    assert result["replay_stats"]["size"] == accounting["stored"]  # the restored transitions and the new ones

    # the memory as checkpointed: real stacks (each next_obs its obs shifted by a frame), each frame once
    before = stored_rows(saved / checkpoint.REPLAY_FILE)
    assert len(before["obs"]) == resumed["stored"] == record["env_steps"]
    np.testing.assert_array_equal(before["obs"][:, 1:], before["next_obs"][:, :-1])
    assert len(before["frames"]) < 1.1 * len(before["obs"])
    # restored exactly: the resumed node checkpointed the memory it had restored, and the rows it
    # restored (none overwritten since) come back byte for byte, their frames in the same stacks
    assert result["checkpoints"]["written"], "the resumed run wrote no checkpoint"
    after = stored_rows(Path(checkpoint.latest(directory)["path"]) / checkpoint.REPLAY_FILE)
    assert len(after["obs"]) > len(before["obs"])
    for name in ("obs", "next_obs", "action", "reward", "done"):
        np.testing.assert_array_equal(after[name][:len(before[name])], before[name], err_msg=name)
    # and sampled exactly: a memory restored from the checkpoint draws the stacks of the stored rows
    memory = PrioritizedReplay(capacity, alpha=0.6, seed=1, frames=4)
    checkpoint.load_replay(saved, memory)
    sample = memory.sample(64, 0.4)
    np.testing.assert_array_equal(sample.transitions["obs"], before["obs"][sample.indices])
    np.testing.assert_array_equal(sample.transitions["next_obs"], before["next_obs"][sample.indices])
