"""`rlbench bench dqn` and `rlbench bench ddpg`: rlbench's algorithm through the real runner
(placement local, uniform replay, cpu compute) beside a CleanRL-style single-file loop with CleanRL's
settings, in the same process, one thread, runs alternating.

Speed is never shown without learning: each side's final returns are printed beside its rate (the
mean of its last training episodes and a greedy evaluation of its final policy). Both rates are
steady rates: rlbench's from its first env step to its last (`throughput.steady_env_steps_per_s`),
the CleanRL-style loop's from after its networks are built (CleanRL's own `start_time`) to its last
step; each side's start-up before that is printed apart.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any, Callable

import click

EVAL_EPISODES = 10
LAST_EPISODES = 10


@dataclass(frozen=True)
class Comparison:
    algo: str
    env: str
    cleanrl_file: str  # where CleanRL's settings come from
    departures: str  # settings that differ from CleanRL's defaults, and why
    rlbench_hyperparameters: Callable[[int], dict[str, Any]]  # total steps -> DQNConfig/DDPGConfig overrides
    cleanrl_run: Callable[[int, int], dict]  # (total steps, seed) -> rlbench.bench.cleanrl_dqn.loop_result


def dqn_hyperparameters(steps: int) -> dict[str, Any]:
    """CleanRL dqn.py's defaults in rlbench's DQNConfig terms (its target period is in env steps,
    rlbench's in learner updates: 500 env steps / train every 10 = 50 updates)."""
    return {"hidden_sizes": (120, 84), "buffer_size": 10_000, "batch_size": 128, "train_every": 10,
            "target_update_every": 50, "tau": 1.0, "learning_rate": 2.5e-4, "learning_starts": 10_000,
            "gamma": 0.99, "loss": "mse", "max_grad_norm": 0.0, "double_dqn": False, "epsilon_start": 1.0,
            "epsilon_end": 0.05, "exploration_steps": steps // 2, "publish_every": 1}


def ddpg_hyperparameters(steps: int) -> dict[str, Any]:
    """CleanRL ddpg_continuous_action.py's settings (learning from step 1,000, see DDPG.departures)."""
    return {"hidden_sizes": (256, 256), "buffer_size": 1_000_000, "batch_size": 256, "train_every": 1,
            "actor_learning_rate": 3e-4, "critic_learning_rate": 3e-4, "learning_starts": 1_000, "gamma": 0.99,
            "tau": 0.005, "policy_delay": 2, "exploration_noise": 0.1, "publish_every": 1}


def _cleanrl_dqn(steps: int, seed: int) -> dict:
    from rlbench.bench.cleanrl_dqn import CleanRLDQNArgs, run

    return run(CleanRLDQNArgs(total_timesteps=steps, seed=seed), EVAL_EPISODES)


def _cleanrl_ddpg(steps: int, seed: int) -> dict:
    from rlbench.bench.cleanrl_ddpg import CleanRLDDPGArgs, run

    return run(CleanRLDDPGArgs(total_timesteps=steps, seed=seed), EVAL_EPISODES)


DQN = Comparison("dqn", "CartPole-v1", "cleanrl/dqn.py", "none (CleanRL's defaults; total steps from --steps)",
                 dqn_hyperparameters, _cleanrl_dqn)
DDPG = Comparison("ddpg", "Pendulum-v1", "cleanrl/ddpg_continuous_action.py",
                  "Pendulum-v1 (CleanRL: Hopper-v4) and learning from step 1,000 (CleanRL: 25,000), as issue #16 "
                  "sets the comparison", ddpg_hyperparameters, _cleanrl_ddpg)


def run_rlbench(comparison: Comparison, steps: int, seed: int) -> dict[str, Any]:
    """One run through rlbench.run; the same fields as the CleanRL-style loop reports."""
    from rlbench.config import RunConfig
    from rlbench.runner import run, stop_series_if_signalled

    config = RunConfig(algo=comparison.algo, env=comparison.env, replay="uniform", compute="cpu", placement="local",
                       seed=seed, steps=steps, eval_episodes=EVAL_EPISODES,
                       hyperparameters=comparison.rlbench_hyperparameters(steps))
    result = stop_series_if_signalled(run(config))
    split = result["loop"]["time_split"]["local"]
    return {"env_steps": result["throughput"]["env_steps"],
            "env_steps_per_s": result["throughput"]["steady_env_steps_per_s"],
            "bookkeeping_s": split["bookkeeping"], "bookkeeping_share": split["bookkeeping_share"],
            "whole_run_env_steps_per_s": result["throughput"]["env_steps_per_s"],
            "startup_s": result["timing"]["startup_s"],
            "episode_returns": [point["return"] for point in result["learning_curve"]],
            "evaluation": result["evaluation"], "hyperparameters": result["hyperparameters"],
            "latency_us": {name: {key: summary[key] for key in ("count", "mean", "p50")}
                           for name, summary in result["latency"].items()}}


def compare(comparison: Comparison, steps: int, repeats: int, seed: int) -> dict[str, Any]:
    """`repeats` pairs of runs, one of each side back to back; the medians of each side's steady rate
    and the ratio within each pair (which slow drift in the machine's load affects least)."""
    from rlbench.kit.bench import pin_one_thread
    from rlbench.machine_state import watch

    threads = pin_one_thread()
    import gymnasium
    import torch

    # One-time imports before either side starts, so that neither's start-up pays for them: the
    # environment's module, and torch._dynamo, which the first optimizer built in a process imports (seconds).
    gymnasium.make(comparison.env).close()
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])

    runs: dict[str, list[dict]] = {"cleanrl": [], "rlbench": []}
    sides = {"cleanrl": lambda i: comparison.cleanrl_run(steps, seed + i),
             "rlbench": lambda i: run_rlbench(comparison, steps, seed + i)}
    with watch(busy_processes=1) as state:
        for i in range(repeats):  # pairs, in alternating order: drift in load and order effects hit both alike
            for side in (("cleanrl", "rlbench") if i % 2 == 0 else ("rlbench", "cleanrl")):
                runs[side].append(sides[side](i))
    medians = {side: statistics.median(r["env_steps_per_s"] for r in side_runs) for side, side_runs in runs.items()}
    paired = [ours["env_steps_per_s"] / theirs["env_steps_per_s"] for ours, theirs in zip(runs["rlbench"], runs["cleanrl"])]
    for side_runs in runs.values():
        for r in side_runs:  # the mean of the last episodes is reported; the full lists would drown the JSON
            last = r.pop("episode_returns")[-LAST_EPISODES:]
            r["last_episodes"] = len(last)
            r["last_episodes_mean_return"] = sum(last) / len(last) if last else None
    return {"algo": comparison.algo, "env": comparison.env, "steps": steps, "repeats": repeats, "seed": seed,
            "threads": threads,
            "settings_from": f"CleanRL {comparison.cleanrl_file}'s Args defaults (github.com/vwxyzjn/cleanrl, read at fe8d8a0)",
            "departures_from_cleanrl": comparison.departures,
            "cleanrl_settings": runs["cleanrl"][0]["settings"],
            "rlbench_hyperparameters": comparison.rlbench_hyperparameters(steps),
            "steady_env_steps_per_s": medians, "ratio_rlbench_to_cleanrl": medians["rlbench"] / medians["cleanrl"],
            "paired_ratios": paired, "median_paired_ratio": statistics.median(paired),
            "runs": runs, "machine_state": state.report()}


def format_report(report: dict[str, Any]) -> str:
    from rlbench.machine_state import summary_line

    settings = ", ".join(f"{k}={v}" for k, v in report["cleanrl_settings"].items() if k not in ("seed", "total_timesteps"))
    lines = [f"# {report['algo'].upper()} {report['env']}, {report['steps']:,} env steps per run, {report['repeats']} "
             f"alternating run(s) per side, threads {report['threads']}",
             f"# settings: {report['settings_from']}: {settings}",
             f"# departures from CleanRL: {report['departures_from_cleanrl']}; rlbench runs the same settings "
             "(placement local, uniform replay, cpu compute)",
             "# steady env steps/s: rlbench from its first env step, the CleanRL-style loop from after building its "
             "networks (as CleanRL's clock); start-up apart: before that (environment, memory, networks; torch, "
             "gymnasium and torch._dynamo were imported before either side)",
             f"# returns: mean of the last {LAST_EPISODES} training episodes, and greedy evaluation over "
             f"{EVAL_EPISODES} episodes",
             summary_line(report["machine_state"]),
             "# loop s: the steady loop's seconds; bookkeeping: what of rlbench's loop is rlbench's own (not env, "
             "inference, learner, replay or weights), beside the CleanRL-style loop's whole loop",
             f"{'side':<14} {'run':>3} {'steady steps/s':>14} {'start-up s':>10} {'loop s':>8} {'bookkeeping':>15} "
             f"{'last-episodes return':>21} {'greedy eval return':>19}"]
    for side in ("cleanrl", "rlbench"):
        for i, r in enumerate(report["runs"][side]):
            last = r["last_episodes_mean_return"]
            evaluation = r["evaluation"]
            loop_s = r["env_steps"] / r["env_steps_per_s"]
            bookkeeping = (f"{r['bookkeeping_s']:.2f} s {r['bookkeeping_share']:5.1%}" if "bookkeeping_s" in r
                           else "-")
            lines.append(f"{side + ('-style' if side == 'cleanrl' else ''):<14} {i:>3} {r['env_steps_per_s']:>14.1f} "
                         f"{r['startup_s']:>10.2f} {loop_s:>8.2f} {bookkeeping:>15} "
                         f"{'n/a' if last is None else f'{last:.1f}':>21} "
                         f"{'n/a' if evaluation is None else format(evaluation['mean_return'], '.1f'):>19}")
    medians = report["steady_env_steps_per_s"]
    lines.append(f"median steady env steps/s: rlbench {medians['rlbench']:.1f}, cleanrl-style {medians['cleanrl']:.1f}: "
                 f"rlbench/cleanrl = {report['ratio_rlbench_to_cleanrl']:.2f}x; run by run (each pair back to back): "
                 + ", ".join(f"{r:.2f}x" for r in report["paired_ratios"])
                 + f" (median {report['median_paired_ratio']:.2f}x)")
    return "\n".join(lines)


def _command(comparison: Comparison, default_steps: int, steps_help: str) -> click.Command:
    @click.command(comparison.algo, help=f"{comparison.algo.upper()} on {comparison.env} with CleanRL's settings: "
                   "rlbench vs a CleanRL-style loop, steady env steps/s and returns, one thread.")
    @click.option("--steps", default=default_steps, show_default=True, type=click.IntRange(min=1), help=steps_help)
    @click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1),
                  help="alternating runs of each; medians are compared")
    @click.option("--seed", default=1, show_default=True)
    @click.option("--json", "as_json", is_flag=True, help="print the measurements as JSON")
    def command(steps: int, repeats: int, seed: int, as_json: bool) -> None:
        report = compare(comparison, steps, repeats, seed)
        click.echo(json.dumps(report, indent=2, default=str) if as_json else format_report(report))

    return command


dqn_command = _command(DQN, 30_000, "env steps per run (CleanRL starts learning at 10,000)")
ddpg_command = _command(DDPG, 6_000, "env steps per run (learning starts at 1,000)")
