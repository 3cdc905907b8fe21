"""`rlbench bench policies`: the same job under each distribution policy and learner count (MSRL).

One invocation, the same DQN CartPole job (the same global batch, replay ratio and seed) under:
policy device (one process), single-learner beside a replay node, and data-parallel with each
--learners count. The job is learner-bound (one update per env step, a large global batch), so
what a second learner buys shows in updates/s. Printed per run: steady updates/s and env steps/s,
each against single-learner's; the all-reduce's time per update and its share of each learner's
time (its own line of the time split); whether the learners' parameters stayed identical; the time
and env steps to the target return where the run reached it. With --netns (root), the learners run
on Ray nodes in network namespaces, one per node, each node pinned to its own core where the machine
has one per learner, so their collectives cross virtual links.

All figures are measured, but one: each data-parallel row's ceiling with a core per learner, estimated
from the learners' CPU time per update and labelled so (the 16 cores it needs to be measured are not
here). Only click is imported at module level.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import click

TARGET_WINDOW = 20  # episodes in the training-return mean that reaches the target
DEFAULT_STEPS = 3000  # env steps per run
DEFAULT_BATCH = 1024  # the global batch (learner-bound)
DEFAULT_TARGET = 195.0
WORTH = 0.5  # a ceiling under 1 + (N - 1) WORTH: each learner added buys under half of one (cannot pay)


def job_hyperparameters(batch_size: int) -> dict[str, Any]:
    """The bench's job: one update per env step on a large global batch (learner-bound)."""
    return {"batch_size": batch_size, "train_every": 1, "learning_starts": 1000, "publish_every": 8}


def policy_config(policy: str, learners: int, steps: int, transport: str, actors: int, seed: int, *,
                  hyperparameters: dict[str, Any], **extra: Any) -> Any:
    """One run of the bench: `policy` with `learners` on the job `hyperparameters` (`rlbench plan
    --check-policies` runs the same, for the plan's job)."""
    from rlbench.config import RunConfig

    placement = "local" if policy == "device" else "server"
    return RunConfig(policy=policy, learners=learners, placement=placement, transport=transport,
                     actors=1 if policy == "device" else actors, steps=steps, seed=seed, eval_episodes=0,
                     hyperparameters=hyperparameters, out=None, **extra)


def summarise(label: str, result: dict[str, Any], target: float) -> dict[str, Any]:
    """One row: the run's steady rates, its all-reduce per update and share, identity, time to target."""
    from rlbench.bench.matrix import time_to_threshold

    loop = result["loop"]
    splits = {name: split for name, split in (loop.get("time_split") or {}).items()
              if name == "learner" or name.startswith("learner-")}
    learners = [r for name, r in (loop.get("roles") or {}).items() if name == "learner" or name.startswith("learner-")]
    updates = max((r.get("updates", 0) for r in learners), default=0) or result["throughput"].get("updates", 0)
    group = loop.get("learner_group") or {}
    allreduce = [split.get("allreduce", 0.0) for split in splits.values()] if group else []
    # each learner's CPU per update in the measured window, its collectives' share included: with a core
    # of its own, a learner updates no faster than this (the ceiling's estimate in format_rows)
    cpu_per_update = [split["cpu_s"] / updates for split in splits.values() if split.get("cpu_s") and updates]
    learning = [split.get("learner", 0.0) + split.get("allreduce", 0.0) for split in splits.values()]
    curve = result.get("learning_curve") or []
    reached_s = time_to_threshold(curve, target, TARGET_WINDOW)
    reached_steps = next((p["step"] for p in curve if p["time_s"] >= reached_s), None) if not math.isnan(reached_s) else None
    return {"run": label, "status": result["status"],
            "updates_per_s": result["throughput"].get("steady_updates_per_s"),
            "env_steps_per_s": result["throughput"].get("steady_env_steps_per_s"),
            "allreduce_ms_per_update": 1e3 * max(allreduce) / updates if allreduce and updates else None,
            "allreduce_share": max(a / t for a, t in zip(allreduce, learning) if t > 0) if allreduce and any(learning)
            else None,
            "cpu_ms_per_update": 1e3 * max(cpu_per_update) if cpu_per_update else None,
            "parameters_identical": group.get("parameters_identical"),
            "time_to_target_s": None if math.isnan(reached_s) else reached_s, "env_steps_to_target": reached_steps,
            "machine_state": result.get("machine_state", {})}


def run_local(learner_counts: tuple[int, ...], steps: int, batch_size: int, transport: str, actors: int,
              seed: int, target: float) -> list[dict[str, Any]]:
    from rlbench.runner import run, stop_series_if_signalled

    rows = []
    for policy, learners in [("device", 1), ("single-learner", 1)] + [("data-parallel", n) for n in learner_counts]:
        result = stop_series_if_signalled(run(policy_config(policy, learners, steps, transport, actors, seed,
                                                            hyperparameters=job_hyperparameters(batch_size))))
        rows.append(summarise(f"{policy} x{learners}", result, target))
    return rows


def run_netns(learner_counts: tuple[int, ...], steps: int, batch_size: int, actors: int, seed: int,
              target: float) -> list[dict[str, Any]]:
    """The same runs on Ray nodes in network namespaces: the replay node and the actors on node a,
    learner i on node i+1 (each node pinned to a core of its own where there is one to spare)."""
    import os

    from rlbench.cluster.netns import namespace_cluster

    most = max(learner_counts)
    cores = os.cpu_count() or 1
    cpusets = [None] + [str(i % cores) for i in range(most)] if cores >= most else None
    rows = []
    with namespace_cluster(nodes=1 + most, cpusets=cpusets) as cluster:
        for policy, learners in [("single-learner", 1)] + [("data-parallel", n) for n in learner_counts]:
            places = ",".join(f"rlb_{chr(98 + i)}" for i in range(learners))
            done = cluster.rlbench(0, "run", "--launcher", "ray", "--ray-address", cluster.address, "--policy", policy,
                                   "--learners", str(learners), "--transport", "tcp", "--actors", str(actors),
                                   "--steps", str(steps), "--seed", str(seed), "--eval-episodes", "0",
                                   "--place", "replay=rlb_a", "--place", "actors=rlb_a", "--place", f"learner={places}",
                                   *[arg for key, value in job_hyperparameters(batch_size).items()
                                     for arg in ("--hp", f"{key}={value}")], "--no-out", "--json", timeout=900)
            if done.returncode not in (0, 1):
                raise click.ClickException(f"{policy} x{learners} on the namespace cluster failed: "
                                           f"{(done.stderr or done.stdout)[-2000:]}")
            rows.append(summarise(f"{policy} x{learners} (netns)", json.loads(done.stdout), target))
    return rows


def ceiling(row: dict[str, Any], single: dict[str, Any] | None) -> float | None:
    """What a data-parallel row could reach with a core for each learner (and the node and actors on
    cores of their own), against single-learner: the one learner's CPU per update over each of this
    row's learners' (the slowest). An estimate from CPU time, not a measurement of those cores."""
    if not single or not single.get("cpu_ms_per_update") or not row.get("cpu_ms_per_update"):
        return None
    return single["cpu_ms_per_update"] / row["cpu_ms_per_update"]


def format_rows(rows: list[dict[str, Any]], header: str) -> str:
    base = next((r for r in rows if r["run"].startswith("single-learner")), None)
    lines = [header, f"{'run':<28} {'updates/s':>10} {'x single':>9} {'env steps/s':>12} {'all-reduce ms/upd':>18} "
                     f"{'share':>6} {'cpu ms/upd':>10} {'ceiling*':>8} {'identical':>9} {'to target s':>12} "
                     f"{'env steps':>10}"]
    verdicts = []
    for r in rows:
        ratio = (r["updates_per_s"] / base["updates_per_s"]) if base and base["updates_per_s"] and r["updates_per_s"] else None
        most = r.get("ceiling_estimated")
        lines.append(f"{r['run']:<28} {_n(r['updates_per_s'], ',.0f'):>10} {_n(ratio, '.2f'):>9} "
                     f"{_n(r['env_steps_per_s'], ',.0f'):>12} {_n(r['allreduce_ms_per_update'], '.3f'):>18} "
                     f"{_n(r['allreduce_share'], '.0%'):>6} {_n(r.get('cpu_ms_per_update'), '.2f'):>10} "
                     f"{_n(most, '.2f'):>8} {_n(r['parameters_identical'], ''):>9} "
                     f"{_n(r['time_to_target_s'], '.1f'):>12} {_n(r['env_steps_to_target'], ',d'):>10}"
                     + ("" if r["status"] == "complete" else f"  ({r['status']})"))
        learners = int(re.search(r"x(\d+)", r["run"]).group(1))
        if most is not None and most < 1 + (learners - 1) * WORTH:
            verdicts.append(f"{r['run']} cannot pay for this model: each learner spent {r['cpu_ms_per_update']:.2f} ms "
                            f"of CPU per update on its share against {base['cpu_ms_per_update']:.2f} ms for one learner "
                            f"on the whole batch, so even a core each gives at most x{most:.2f}, each learner added "
                            f"buying under {WORTH:.0%} of one (an update's cost "
                            "that does not shrink with the batch, and the collectives, dominate: a model whose update "
                            "is mostly per-sample compute, such as the Atari CNN, is where it starts to pay)")
    lines.append("* ceiling: estimated, not measured: single-learner's CPU per update over each data-parallel "
                 "learner's (the slowest), what the group could reach with a core for each learner")
    return "\n".join(lines + verdicts)


def _n(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


@click.command("policies")
@click.option("--learners", "learner_counts", multiple=True, type=click.IntRange(min=2), default=(2, 4),
              show_default=True, help="data-parallel learner counts (repeatable)")
@click.option("--steps", type=int, default=DEFAULT_STEPS, show_default=True, help="env steps per run")
@click.option("--batch-size", type=int, default=DEFAULT_BATCH, show_default=True,
              help="the global batch, split between the learners (learner-bound when large)")
@click.option("--transport", default="tcp", show_default=True)
@click.option("--actors", type=int, default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--target", type=float, default=DEFAULT_TARGET, show_default=True,
              help=f"the training-return mean (over {TARGET_WINDOW} episodes) whose first time is 'to target'")
@click.option("--netns", is_flag=True, help="(root) also on Ray nodes in network namespaces, one learner per node")
@click.option("--json", "as_json", is_flag=True)
def command(learner_counts: tuple[int, ...], steps: int, batch_size: int, transport: str, actors: int, seed: int,
            target: float, netns: bool, as_json: bool) -> None:
    """The same job under each distribution policy and learner count: updates/s, env steps/s, the
    all-reduce per update and its share of each learner's time, time to target, side by side."""
    from rlbench.errors import RlbenchError
    from rlbench.machine_state import summary_line, watch

    for n in learner_counts:
        if batch_size % n:
            raise click.BadParameter(f"batch size {batch_size} does not split into {n} equal shares", param_hint="--learners")
    with watch(busy_processes=2 + actors + max(learner_counts)) as machine:
        rows = run_local(learner_counts, steps, batch_size, transport, actors, seed, target)
        if netns:
            from rlbench.cluster.netns import namespaces_unavailable

            reason = namespaces_unavailable()
            if reason:
                raise RlbenchError(f"--netns: {reason}")
            rows += run_netns(learner_counts, steps, batch_size, actors, seed, target)
    base = next((r for r in rows if r["run"].startswith("single-learner")), None)
    for row in rows:  # (estimated: format_rows says so beside it)
        row["ceiling_estimated"] = ceiling(row, base) if row["run"].startswith("data-parallel") else None
    if as_json:
        click.echo(json.dumps({"rows": rows, "machine_state": machine.report()}, indent=1, default=str))
        return
    click.echo(format_rows(rows, f"DQN CartPole-v1, {steps} env steps, global batch {batch_size}, one update per env "
                                 f"step (learner-bound), transport {transport}, {actors} actor(s); all measured, steady "
                                 f"rates\n{summary_line(machine.report())}"))
