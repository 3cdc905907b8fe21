"""`rlbench bench dqn`: env steps/s of rlbench's DQN (the real runner, uniform replay) beside a
CleanRL-style single-file DQN, same hyperparameters, same process, one thread."""

from __future__ import annotations

import json
import statistics

import click


def cleanrl_hyperparameters(steps: int) -> dict:
    """CleanRL dqn.py's defaults in rlbench's DQNConfig terms (its target period is in env steps,
    rlbench's in learner updates: 500 env steps / train every 10 = 50 updates)."""
    return {"hidden_sizes": (120, 84), "buffer_size": 10_000, "batch_size": 128, "train_every": 10,
            "target_update_every": 50, "tau": 1.0, "learning_rate": 2.5e-4, "learning_starts": 10_000,
            "gamma": 0.99, "loss": "mse", "max_grad_norm": 0.0, "double_dqn": False, "epsilon_start": 1.0,
            "epsilon_end": 0.05, "exploration_steps": steps // 2, "publish_every": 1}


def run_rlbench(steps: int, seed: int) -> float:
    from rlbench.config import RunConfig
    from rlbench.runner import run

    result = run(RunConfig(algo="dqn", env="CartPole-v1", replay="uniform", compute="cpu", seed=seed,
                           steps=steps, eval_episodes=0, hyperparameters=cleanrl_hyperparameters(steps)))
    return float(result["throughput"]["env_steps_per_s"])


def run_cleanrl(steps: int, seed: int) -> float:
    from rlbench.bench.cleanrl_dqn import CleanRLDQNArgs, run

    return float(run(CleanRLDQNArgs(total_timesteps=steps, seed=seed))["env_steps_per_s"])


@click.command("dqn")
@click.option("--steps", default=30_000, show_default=True, help="env steps per run (CleanRL starts learning at 10,000)")
@click.option("--repeats", default=1, show_default=True, help="alternating runs of each; medians are compared")
@click.option("--seed", default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the measurements as JSON")
def dqn_command(steps: int, repeats: int, seed: int, as_json: bool) -> None:
    """DQN on CartPole-v1 with CleanRL's hyperparameters: rlbench vs a CleanRL-style loop, env steps/s."""
    from rlbench.kit.bench import pin_one_thread

    pinned = pin_one_thread()
    cleanrl, rlbench = [], []
    for i in range(repeats):  # alternate, so drift in machine load hits both alike
        cleanrl.append(run_cleanrl(steps, seed + i))
        rlbench.append(run_rlbench(steps, seed + i))
    ratio = statistics.median(rlbench) / statistics.median(cleanrl)
    if as_json:
        click.echo(json.dumps({"threads": pinned, "steps": steps, "cleanrl_env_steps_per_s": cleanrl,
                               "rlbench_env_steps_per_s": rlbench, "ratio": ratio}, indent=2))
        return
    click.echo(f"# DQN CartPole-v1, CleanRL hyperparameters, {steps} env steps, threads {pinned}")
    click.echo(f"{'cleanrl-style env steps/s':>26} {'rlbench env steps/s':>20} {'rlbench/cleanrl':>16}")
    click.echo(f"{statistics.median(cleanrl):>26.0f} {statistics.median(rlbench):>20.0f} {ratio:>15.2f}x")
