"""`rlbench bench dqn` and `rlbench bench ddpg`: rlbench's algorithm through the real runner
(placement local, uniform replay, cpu compute) beside a CleanRL-style single-file loop with CleanRL's
settings, in the same process, one thread, runs alternating.

Speed is never shown without learning: each side's final returns are printed beside its rate (the
mean of its last training episodes and an evaluation of its final policy). Both rates are
steady rates: rlbench's from its first env step to its last (`throughput.steady_env_steps_per_s`),
the CleanRL-style loop's from after its networks are built (CleanRL's own `start_time`) to its last
step; each side's start-up before that is printed apart.

One table of comparisons, chosen by algorithm and `--env`: DQN on CartPole-v1 (CleanRL's dqn.py), on
ALE/Breakout-v5 (dqn_atari.py: Atari frames, the Nature CNN, SB3's frame-sharing buffer) and on
MinAtar/Breakout-v1 (CleanRL has no MinAtar script: a loop in CleanRL's style with the settings of
MinAtar's own examples/dqn.py, rlbench.bench.cleanrl_dqn_minatar); DDPG on Pendulum-v1 and
HalfCheetah-v5 (ddpg_continuous_action.py).

`--study DIR` also writes every run of both sides as an rlbench result under DIR (rlbench's as its
runner writes it; the peer's in the same schema, its learning curve and evaluation where a result keeps
them), one study whose axis is `harness`, so that `rlbench report DIR` puts the two sides' returns,
intervals and learning curves side by side. Several `bench` processes (seeds) may write into one folder.
"""

from __future__ import annotations

import importlib
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

EVAL_EPISODES = 10
LAST_EPISODES = 10
TIME_SPLIT = ("env", "inference", "learner", "replay", "weights")  # where rlbench's loop spends its seconds
CLEANRL_DDPG_LEARNING_STARTS = 25_000  # ddpg_continuous_action.py's (CleanRLDDPGArgs keeps issue #16's 1,000)


@dataclass(frozen=True)
class Comparison:
    algo: str
    env: str  # rlbench's environment id
    settings_from: str  # where the peer's settings come from (see cleanrl_settings)
    departures: str  # settings that differ from the reference's defaults, and why
    rlbench_hyperparameters: Callable[[int], dict[str, Any]]  # total steps -> DQNConfig/DDPGConfig overrides
    cleanrl_run: Callable[[int, int], dict]  # (total steps, seed) -> rlbench.bench.cleanrl_dqn.loop_result
    default_steps: int
    steps_help: str  # how the default run of default_steps spends them
    # what each side's returns count: (training episodes, evaluation) of the CleanRL-style loop; rlbench's
    # training returns are what its environment's EnvSpec.returns says, its evaluation greedy on raw rewards
    cleanrl_returns: tuple[str, str] = ("raw", "greedy")
    cleanrl_imports: tuple[str, ...] = ()  # modules the CleanRL-style loop imports, imported before either side


def cleanrl_settings(file: str) -> str:
    return f"CleanRL {file}'s Args defaults (github.com/vwxyzjn/cleanrl, read at fe8d8a0)"


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


def short_budget_start(cleanrl_learning_starts: int, steps: int) -> int:
    """CleanRL's first learning step, or the end of the run's first tenth when that comes sooner: the
    Atari and MuJoCo scripts learn from step 80,000 / 25,000 of runs of 10 M / 1 M, and a bench run
    of a few thousand steps must spend most of them learning to measure learning's pace."""
    return min(cleanrl_learning_starts, steps // 10)


def dqn_atari_args(steps: int, seed: int = 1):
    """CleanRL dqn_atari.py's Args for a run of `steps`: its defaults, learning from short_budget_start,
    and a memory no larger than the run (one that never wraps behaves the same; 1 M stacked frames
    would reserve 28 GB, more than this machine has)."""
    from rlbench.bench.cleanrl_dqn_atari import CleanRLDQNAtariArgs

    defaults = CleanRLDQNAtariArgs()
    return CleanRLDQNAtariArgs(total_timesteps=steps, seed=seed,
                               learning_starts=short_budget_start(defaults.learning_starts, steps),
                               buffer_size=min(defaults.buffer_size, steps))


def dqn_atari_hyperparameters(steps: int) -> dict[str, Any]:
    """dqn_atari_args in rlbench's DQNConfig terms (the target period in learner updates: 1,000 env
    steps / train every 4 = 250; CleanRL's network is the one rlbench chooses for 84x84x4 frames)."""
    args = dqn_atari_args(steps)
    return {"buffer_size": args.buffer_size, "batch_size": args.batch_size, "train_every": args.train_frequency,
            "target_update_every": args.target_network_frequency // args.train_frequency, "tau": args.tau,
            "learning_rate": args.learning_rate, "learning_starts": args.learning_starts, "gamma": args.gamma,
            "loss": "mse", "max_grad_norm": 0.0, "double_dqn": False, "epsilon_start": args.start_e,
            "epsilon_end": args.end_e, "exploration_steps": int(args.exploration_fraction * steps), "publish_every": 1}


def ddpg_mujoco_args(steps: int, seed: int = 1):
    """CleanRL ddpg_continuous_action.py's Args on HalfCheetah-v5: its defaults, learning from
    short_budget_start (CleanRL: 25,000)."""
    from rlbench.bench.cleanrl_ddpg import CleanRLDDPGArgs

    return CleanRLDDPGArgs(env_id="HalfCheetah-v5", total_timesteps=steps, seed=seed,
                           learning_starts=short_budget_start(CLEANRL_DDPG_LEARNING_STARTS, steps))


def ddpg_mujoco_hyperparameters(steps: int) -> dict[str, Any]:
    return {**ddpg_hyperparameters(steps), "learning_starts": ddpg_mujoco_args(steps).learning_starts}


def dqn_minatar_args(steps: int, seed: int = 1):
    """MinAtar examples/dqn.py's settings (Adam, see rlbench.bench.cleanrl_dqn_minatar) for a run of `steps`."""
    from rlbench.bench.cleanrl_dqn_minatar import CleanRLDQNMinAtarArgs

    return CleanRLDQNMinAtarArgs(total_timesteps=steps, seed=seed)


def dqn_minatar_hyperparameters(steps: int) -> dict[str, Any]:
    """dqn_minatar_args in rlbench's DQNConfig terms, which are rlbench's "minatar" preset (one update per
    step, so the target period in updates is MinAtar's). Epsilon falls linearly from step 0 to where
    MinAtar's ends (1 -> 0.1 by step 105,000), where MinAtar's stays 1 for its first 5,000 frames."""
    args = dqn_minatar_args(steps)
    return {"buffer_size": args.buffer_size, "batch_size": args.batch_size, "train_every": args.train_frequency,
            "target_update_every": args.target_network_frequency, "tau": 1.0, "learning_rate": args.learning_rate,
            "learning_starts": args.learning_starts, "gamma": args.gamma, "loss": "huber", "max_grad_norm": 0.0,
            "double_dqn": False, "epsilon_start": args.start_e, "epsilon_end": args.end_e,
            "exploration_steps": args.learning_starts + args.exploration_frames, "publish_every": 1}


def _cleanrl_dqn(steps: int, seed: int) -> dict:
    from rlbench.bench.cleanrl_dqn import CleanRLDQNArgs, run

    return run(CleanRLDQNArgs(total_timesteps=steps, seed=seed), EVAL_EPISODES)


def _cleanrl_ddpg(steps: int, seed: int) -> dict:
    from rlbench.bench.cleanrl_ddpg import CleanRLDDPGArgs, run

    return run(CleanRLDDPGArgs(total_timesteps=steps, seed=seed), EVAL_EPISODES)


def _cleanrl_dqn_atari(steps: int, seed: int) -> dict:
    from rlbench.bench.cleanrl_dqn_atari import run

    return run(dqn_atari_args(steps, seed), EVAL_EPISODES)


def _cleanrl_dqn_minatar(steps: int, seed: int) -> dict:
    from rlbench.bench.cleanrl_dqn_minatar import run

    return run(dqn_minatar_args(steps, seed), EVAL_EPISODES)


def _cleanrl_ddpg_mujoco(steps: int, seed: int) -> dict:
    from rlbench.bench.cleanrl_ddpg import run

    return run(ddpg_mujoco_args(steps, seed), EVAL_EPISODES)


DQN = Comparison("dqn", "CartPole-v1", cleanrl_settings("cleanrl/dqn.py"),
                 "none (CleanRL's defaults; total steps from --steps)",
                 dqn_hyperparameters, _cleanrl_dqn, 30_000, "CleanRL starts learning at 10,000")
DQN_ATARI = Comparison(
    "dqn", "ALE/Breakout-v5", cleanrl_settings("cleanrl/dqn_atari.py"),
    "learning from min(80,000, steps/10) and a memory of min(1,000,000, steps) transitions, so a short run "
    "mostly learns (see short_budget_start); CleanRL's BreakoutNoFrameskip-v4 on its side, ALE/Breakout-v5 as "
    "rlbench makes it on rlbench's", dqn_atari_hyperparameters, _cleanrl_dqn_atari, 10_000,
    "learning from the first tenth; CleanRL: 80,000",
    ("the raw score of whole games (RecordEpisodeStatistics beneath EpisodicLifeEnv and ClipRewardEnv)",
     "CleanRL's dqn_eval: training wrappers, epsilon 0.01, raw score of whole games"),
    ("ale_py", "stable_baselines3.common.atari_wrappers", "stable_baselines3.common.buffers"))
DDPG = Comparison("ddpg", "Pendulum-v1", cleanrl_settings("cleanrl/ddpg_continuous_action.py"),
                  "Pendulum-v1 (CleanRL: Hopper-v4) and learning from step 1,000 (CleanRL: 25,000), as issue #16 "
                  "sets the comparison", ddpg_hyperparameters, _cleanrl_ddpg, 6_000,
                  "learning starts at 1,000")
DDPG_MUJOCO = Comparison(
    "ddpg", "HalfCheetah-v5", cleanrl_settings("cleanrl/ddpg_continuous_action.py"),
    "HalfCheetah-v5 (CleanRL: Hopper-v4) and learning from min(25,000, steps/10), so a short run mostly learns "
    "(see short_budget_start)", ddpg_mujoco_hyperparameters, _cleanrl_ddpg_mujoco, 10_000,
    "learning from the first tenth; CleanRL: 25,000")
DQN_MINATAR = Comparison(
    "dqn", "MinAtar/Breakout-v1",
    "MinAtar examples/dqn.py's settings (github.com/kenjyoung/MinAtar, read at 3f078e5) in a CleanRL-style loop "
    "(CleanRL has no MinAtar script)",
    "Adam at MinAtar's 2.5e-4 on both sides (MinAtar: centered RMSProp), as rlbench's minatar preset steps it; "
    "MinAtar's own gymnasium env on the peer's side, rlbench's MinAtar env (the same game, channels first) on "
    "rlbench's; rlbench's epsilon falls from step 0 to MinAtar's 0.1 at step 105,000, MinAtar's from step 5,000",
    dqn_minatar_hyperparameters, _cleanrl_dqn_minatar, 20_000, "learning from 5,000, as MinAtar",
    cleanrl_imports=("minatar.gym",))
COMPARISONS = (DQN, DQN_ATARI, DQN_MINATAR, DDPG, DDPG_MUJOCO)
HARNESS = {"rlbench": "rlbench", "cleanrl": "cleanrl-style"}  # each side's value of a --study's one axis


def comparison_for(algo: str, env: str) -> Comparison:
    """The comparison of `algo` on `env`, or a one-line refusal naming those that exist."""
    import difflib

    from rlbench.errors import RlbenchError

    envs = {c.env: c for c in COMPARISONS if c.algo == algo}
    if env in envs:
        return envs[env]
    close = difflib.get_close_matches(env, list(envs), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise RlbenchError(f"no {algo} comparison with CleanRL on {env!r}; {hint}{algo} is compared on: "
                       f"{', '.join(envs)}")


def run_rlbench(comparison: Comparison, steps: int, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One run through rlbench.run: the same fields as the CleanRL-style loop reports, and the result."""
    from rlbench.config import RunConfig
    from rlbench.runner import run, stop_series_if_signalled

    config = RunConfig(algo=comparison.algo, env=comparison.env, replay="uniform", compute="cpu", placement="local",
                       seed=seed, steps=steps, eval_episodes=EVAL_EPISODES,
                       hyperparameters=comparison.rlbench_hyperparameters(steps))
    result = stop_series_if_signalled(run(config))
    split = result["loop"]["time_split"]["local"]
    return result, {"env_steps": result["throughput"]["env_steps"],
            "env_steps_per_s": result["throughput"]["steady_env_steps_per_s"],
            "bookkeeping_s": split["bookkeeping"], "bookkeeping_share": split["bookkeeping_share"],
            "time_split_s": {part: split[part] for part in TIME_SPLIT},
            "whole_run_env_steps_per_s": result["throughput"]["env_steps_per_s"],
            "startup_s": result["timing"]["startup_s"],
            "learning_curve": result["learning_curve"],
            "evaluation": result["evaluation"], "hyperparameters": result["hyperparameters"],
            "latency_us": {name: {key: summary[key] for key in ("count", "mean", "p50")}
                           for name, summary in result["latency"].items()}}


def _rlbench_returns(env_id: str) -> tuple[str, str]:
    """What rlbench's training and evaluation returns count on `env_id`, read from the environment it
    makes (EnvSpec.returns; capabilities.evaluation_mode: evaluation episodes on the raw score)."""
    from rlbench.plugins import get_registry

    component = get_registry().get("environment", env_id)
    env = component.create(num_envs=1, seed=0)
    try:
        training = env.spec.returns
    finally:
        env.close()
    evaluation = "greedy" + (", the environment's evaluation mode (raw score)"
                             if component.capabilities.evaluation_mode else "")
    return training, evaluation


def study_block(study: Path, side: str, seed: int, steps: int) -> dict[str, Any]:
    """The "study" block of a run written under --study (the fields rlbench sweep writes)."""
    combination = {"harness": HARNESS[side]}
    return {"name": study.name, "cell": f"harness-{HARNESS[side]}_seed-{seed}", "combination": combination,
            "seed": seed, "axes": ["harness"], "target_return": None, "target_window": LAST_EPISODES,
            "reference_scores": {}, "requested": {"steps": steps, **combination}, "concurrent_cells": 1}


def peer_result(comparison: Comparison, steps: int, seed: int, run: dict[str, Any], started_unix: float,
                machine_state: dict[str, Any], training_returns: str) -> dict[str, Any]:
    """A CleanRL-style loop's run as an rlbench result (schema rlbench.result/1), so that a report reads it
    beside rlbench's: what it measured (rates, the learning curve, the evaluation, the machine's state);
    what only rlbench's runner measures (latencies, accounting, energy) left empty."""
    from rlbench.fingerprint import machine_fingerprint
    from rlbench.results import SCHEMA

    wall = run["startup_s"] + run["wall_s"]
    return {"schema": SCHEMA, "status": "complete", "notes": [f"peer: {comparison.settings_from}; departures: "
                                                              f"{comparison.departures}"],
            "config": {"algo": comparison.algo, "env": comparison.env, "seed": seed, "steps": steps,
                       "replay": None, "compute": "cpu", "placement": "local", "harness": HARNESS["cleanrl"]},
            "hyperparameters": run["settings"], "fingerprint": machine_fingerprint(),
            "timing": {"started_unix": started_unix, "wall_s": wall, "cpu_s": machine_state["own_cpu_s"],
                       "startup_s": run["startup_s"]},
            "throughput": {"env_steps": run["env_steps"], "env_steps_per_s": run["env_steps"] / wall,
                           "steady_env_steps_per_s": run["env_steps_per_s"]},
            "machine_state": machine_state, "latency": {}, "learning_curve": run["learning_curve"],
            "evaluation": run["evaluation"],
            "returns": {"learning_curve": training_returns, "evaluation": comparison.cleanrl_returns[1]},
            "energy": {}, "accounting": {}}


def compare(comparison: Comparison, steps: int, repeats: int, seed: int, study: str | None = None) -> dict[str, Any]:
    """`repeats` pairs of runs, one of each side back to back; the medians of each side's steady rate
    and the ratio within each pair (which slow drift in the machine's load affects least). With `study`,
    each run is also written as a result under `study`/runs (see the module's docstring)."""
    from rlbench.kit.bench import pin_one_thread
    from rlbench.machine_state import watch
    from rlbench.results import write

    threads = pin_one_thread()
    import torch

    # One-time imports before either side starts, so that neither's start-up pays for them: the
    # environment's modules (gymnasium, ale_py, mujoco: its environment made once through rlbench's
    # registry, which also says what its training returns count), the CleanRL-style loop's own
    # (stable-baselines3), and torch._dynamo, which the first optimizer built in a process imports (seconds).
    rlbench_returns = _rlbench_returns(comparison.env)
    for module in comparison.cleanrl_imports:
        importlib.import_module(module)
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])

    folder = Path(study) if study else None

    def cleanrl_side(i: int) -> dict[str, Any]:
        started = time.time()
        with watch(busy_processes=1) as run_state:
            run = comparison.cleanrl_run(steps, seed + i)
        if folder:
            result = peer_result(comparison, steps, seed + i, run, started, run_state.report(),
                                 comparison.cleanrl_returns[0])
            result["study"] = study_block(folder, "cleanrl", seed + i, steps)
            write(result, str(folder / "runs" / f"{result['study']['cell']}.json"))
        return run

    def rlbench_side(i: int) -> dict[str, Any]:
        result, run = run_rlbench(comparison, steps, seed + i)
        if folder:
            result["study"] = study_block(folder, "rlbench", seed + i, steps)
            write(result, str(folder / "runs" / f"{result['study']['cell']}.json"))
        return run

    runs: dict[str, list[dict]] = {"cleanrl": [], "rlbench": []}
    sides = {"cleanrl": cleanrl_side, "rlbench": rlbench_side}
    with watch(busy_processes=1) as state:
        for i in range(repeats):  # pairs, in alternating order: drift in load and order effects hit both alike
            for side in (("cleanrl", "rlbench") if i % 2 == 0 else ("rlbench", "cleanrl")):
                runs[side].append(sides[side](i))
    medians = {side: statistics.median(r["env_steps_per_s"] for r in side_runs) for side, side_runs in runs.items()}
    paired = [ours["env_steps_per_s"] / theirs["env_steps_per_s"] for ours, theirs in zip(runs["rlbench"], runs["cleanrl"])]
    for side_runs in runs.values():
        for r in side_runs:  # the mean of the last episodes is reported; the full lists would drown the JSON
            last = [point["return"] for point in r.pop("learning_curve")[-LAST_EPISODES:]]
            r["last_episodes"] = len(last)
            r["last_episodes_mean_return"] = sum(last) / len(last) if last else None
    cleanrl_training, cleanrl_evaluation = comparison.cleanrl_returns
    return {"algo": comparison.algo, "env": comparison.env, "steps": steps, "repeats": repeats, "seed": seed,
            "threads": threads,
            "returns": {"cleanrl": {"training": cleanrl_training, "evaluation": cleanrl_evaluation},
                        "rlbench": {"training": rlbench_returns[0], "evaluation": rlbench_returns[1]}},
            "settings_from": comparison.settings_from, "departures": comparison.departures,
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
             f"# departures from the reference: {report['departures']}; rlbench runs the same settings "
             "(placement local, uniform replay, cpu compute)",
             "# steady env steps/s: rlbench from its first env step, the CleanRL-style loop from after building its "
             "networks (as CleanRL's clock); start-up apart: before that (environment, memory, networks; torch, "
             "gymnasium and torch._dynamo were imported before either side)",
             f"# returns: mean of the last {LAST_EPISODES} training episodes, and an evaluation over {EVAL_EPISODES} "
             "episodes, of:",
             *(f"#   {side + ('-style' if side == 'cleanrl' else '')}: training returns: {counted['training']}; "
               f"evaluation: {counted['evaluation']}" for side, counted in report["returns"].items()),
             summary_line(report["machine_state"]),
             "# loop s: the steady loop's seconds; bookkeeping: what of rlbench's loop is rlbench's own (not env, "
             "inference, learner, replay or weights), beside the CleanRL-style loop's whole loop",
             f"{'side':<14} {'run':>3} {'steady steps/s':>14} {'start-up s':>10} {'loop s':>8} {'bookkeeping':>15} "
             f"{'last-episodes return':>21} {'eval return':>19}"]
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
    for i, r in enumerate(report["runs"]["rlbench"]):
        lines.append(f"# rlbench run {i}, seconds in: " + ", ".join(f"{part} {seconds:.2f}"
                                                                  for part, seconds in r["time_split_s"].items()))
    medians = report["steady_env_steps_per_s"]
    lines.append(f"median steady env steps/s: rlbench {medians['rlbench']:.1f}, cleanrl-style {medians['cleanrl']:.1f}: "
                 f"rlbench/cleanrl = {report['ratio_rlbench_to_cleanrl']:.2f}x; run by run (each pair back to back): "
                 + ", ".join(f"{r:.2f}x" for r in report["paired_ratios"])
                 + f" (median {report['median_paired_ratio']:.2f}x)")
    return "\n".join(lines)


def _command(algo: str) -> click.Command:
    comparisons = [c for c in COMPARISONS if c.algo == algo]
    steps_help = "env steps per run; by default " + "; ".join(f"{c.env}: {c.default_steps:,} ({c.steps_help})"
                                                               for c in comparisons)

    references = "CleanRL's" + ("; MinAtar's own on MinAtar" if any("MinAtar" in c.env for c in comparisons) else "")

    @click.command(algo, help=f"{algo.upper()} on {', '.join(c.env for c in comparisons)} with the reference's "
                   f"settings ({references}): rlbench vs a CleanRL-style loop, steady env steps/s and returns, one "
                   "thread.")
    @click.option("--env", "env_id", default=comparisons[0].env, show_default=True,
                  help="the environment; one with a comparison: " + ", ".join(c.env for c in comparisons))
    @click.option("--steps", type=click.IntRange(min=1), help=steps_help)
    @click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1),
                  help="alternating runs of each; medians are compared")
    @click.option("--seed", default=1, show_default=True)
    @click.option("--json", "as_json", is_flag=True, help="print the measurements as JSON")
    @click.option("--study", metavar="DIR", help="also write every run of both sides as a result under DIR, one "
                  "study whose axis is `harness`, for `rlbench report DIR`")
    def command(env_id: str, steps: int | None, repeats: int, seed: int, as_json: bool, study: str | None) -> None:
        comparison = comparison_for(algo, env_id)
        if study:
            from rlbench.results import check_writable

            check_writable(study)
        report = compare(comparison, steps or comparison.default_steps, repeats, seed, study)
        click.echo(json.dumps(report, indent=2, default=str) if as_json else format_report(report))

    return command


dqn_command = _command("dqn")
ddpg_command = _command("ddpg")
