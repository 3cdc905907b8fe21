"""The one-device loop: environment, actor, replay memory and learner on one accelerator, which is
handed many steps per launch (the design of PureJaxRL and Isaac Gym, in torch).

Why: on a GPU a small RL step is dozens of tiny kernels, each launched from the host, plus host
round trips; an H100 ran the local loop's DQN at 0.54x one CPU core and idled ~90 % of the time
(plugins/gpu/README.md, "What the hardware taught"). Launching S env steps or K updates as one
captured graph, and never reading a device value on the host inside them, removes both costs.

When: the runner selects it for a replay-loop algorithm at placement `local` when the environment,
the replay memory and the compute backend all declare the same accelerator device (not "cpu") and
offer the interface below; every other combination runs rlbench/runtime/local.py's loop. The result
says which ran (result["loop"]["name"]: "device" here). This module is the entry point a
distribution policy "device" (MSRL's idea, DESIGN.md) would name: `refusal(ctx, devices)` says
why it cannot run a context, `run_device_loop(ctx)` runs one.

Each round:
  1. one env launch: S vector steps (hp.env_steps_per_launch), each with exploring actions from the
     learner's own network (on one device the actor needs no published copy) and its transitions
     written straight into the replay memory; episode returns and ends are kept on the device;
  2. the episodes that ended reach the host in one copy: the round's only wait for the device, and
     where the previous round's replay flags (refused captured calls) are read;
  3. learner launches of K updates each (hp.updates_per_launch), as many as the replay ratio owes:
     one update per hp.train_every env steps from max(learning_starts, batch_size) on, counted as
     the local loop counts them. A remainder below K waits for the next round, and the run's end
     runs it uncaptured, so a run makes exactly the local loop's number of updates; K and S change
     when work is launched, never how much. The learner's schedules (epsilon, beta, the target
     network's period) are read from device counters, beta annealed once per round.
A run's last env chunk, when the budget ends inside S steps, runs uncaptured for just the steps
left, so env steps equal the local loop's too.

The interface (duck-typed; the gpu plugin's components are the first to offer it):
  compute.capture(function, generators) -> launch   launch() runs function() as one captured unit
                                                    (eager on a CPU device); generators: those it draws from
  env.rollout(steps, act, record), env.generator    steps of every row with act(obs) -> actions, then
                                                    record(obs, actions, rewards, final_obs, terminated, truncated)
  replay.write(transitions), replay.draw(batch_size, beta), replay.set_priorities(indices, priorities),
  replay.check_flags(), replay.count_captured(...), replay.generator
                                                    add / sample / update_priorities, capturable: device
                                                    tensors, device-side flags, host counts told afterwards
  algorithm.captures_on_one_device = True; its learner's prepare_capture(seed), explore(obs, env_step),
  device_updates(replay, count, beta), generator, and optionally launch_refusal(count)
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from rlbench.algorithms.common import beta_at
from rlbench.errors import RlbenchError
from rlbench.runtime.context import LoopStats, RunContext
from rlbench.runtime.transitions import transition

NAME = "device"
HOST_DEVICES = (None, "cpu", "host")  # what components on the host declare: never "one accelerator"
PROGRESS_EVERY_S = 0.25
ENV_METHODS = ("rollout", "generator")
REPLAY_METHODS = ("write", "draw", "set_priorities", "check_flags", "count_captured", "generator")


def refusal(ctx: RunContext, devices: dict[str, str | None]) -> str | None:
    """Why the one-device loop cannot run `ctx`, or None when it can. `devices`: the device each
    component declares in its capabilities, by kind ("environment", "replay memory", "compute")."""
    if ctx.config.placement != "local":
        return f"placement {ctx.config.placement}: the one-device loop is a single process"
    found = set(devices.values())
    if len(found) != 1 or found & set(HOST_DEVICES):
        return ("the environment, replay memory and compute backend must all declare one accelerator device; "
                "they declare " + ", ".join(f"{kind} {device or 'none'}" for kind, device in devices.items()))
    device = found.pop()
    if not getattr(ctx.algorithm, "captures_on_one_device", False):
        return f"algorithm {getattr(ctx.algorithm, 'name', '?')} offers no captured learner"
    for what, component, names in (("environment", ctx.env, ENV_METHODS), ("replay memory", ctx.replay, REPLAY_METHODS),
                                   ("compute backend", ctx.compute, ("capture",))):
        missing = [name for name in names if not hasattr(component, name)]
        if missing:
            return f"the {what} on {device} offers no {', '.join(missing)}"
    return None


def updates_owed(hp: Any, step: int) -> int:
    """Learner updates the local loop has made once `step` env steps are done."""
    first = max(hp.learning_starts, hp.batch_size)
    return 0 if step < first else (step - first) // hp.train_every + 1


def run_device_loop(ctx: RunContext) -> LoopStats:
    import torch

    hp, env, replay, compute, budget, recorder = ctx.hp, ctx.env, ctx.replay, ctx.compute, ctx.budget, ctx.recorder
    spec, seed = env.spec, ctx.config.seed
    n, per_launch, steps_per_launch = spec.num_envs, hp.updates_per_launch, hp.env_steps_per_launch
    if per_launch < 1 or steps_per_launch < 1:
        raise RlbenchError(f"updates_per_launch ({per_launch}) and env_steps_per_launch ({steps_per_launch}) "
                           "must be at least 1")
    learner = ctx.algorithm.make_learner(spec, compute, hp, seed)
    why = getattr(learner, "launch_refusal", lambda count: None)(per_launch)
    if why:
        raise RlbenchError(why)
    learner.prepare_capture(seed)
    device = learner.device
    env_step = torch.zeros((), dtype=torch.int64, device=device)  # env steps so far, for exploration schedules
    beta = torch.zeros((), dtype=torch.float64, device=device)
    episodes = DeviceEpisodes(n, steps_per_launch, device)
    generators = [env.generator, replay.generator, learner.generator]

    def env_chunk(steps: int) -> None:
        rows = iter(range(steps))  # which row of the launch's episode record; fixed at capture

        def record(obs, actions, rewards, final_obs, terminated, truncated) -> None:
            replay.write(transition(obs, actions, rewards, final_obs, terminated.to(torch.float32)))
            episodes.record(next(rows), rewards, terminated | truncated)
            env_step.add_(n)

        env.rollout(steps, lambda obs: learner.explore(obs, env_step), record)

    env_launch = compute.capture(lambda: env_chunk(steps_per_launch), generators)
    learner_launch = compute.capture(lambda: learner.device_updates(replay, per_launch, beta), generators)
    h_env, h_learn, h_host = (recorder.histogram(name) for name in ("env.launch", "learner.launch", "episodes.to_host"))
    clock = time.perf_counter_ns

    env.reset(seed=seed)
    stats = LoopStats()
    stats.first_step_t = time.perf_counter()
    step = updates = env_launches = learner_launches = uncaptured_env_steps = 0
    next_progress = time.perf_counter() + PROGRESS_EVERY_S
    while not budget.exhausted(step):
        vector_steps = min(steps_per_launch, math.ceil((budget.total_steps - step) / n))
        t0 = clock()
        if vector_steps == steps_per_launch:
            env_launch()
            env_launches += 1
        else:  # the budget ends inside a launch: just the steps left, uncaptured
            env_chunk(vector_steps)
            uncaptured_env_steps += vector_steps * n
        t1 = clock()
        episodes.to_curve(ctx.curve, step, vector_steps)  # waits for the device: the round's one sync
        replay.check_flags()  # the previous round's learner launches: done by now, so this waits for nothing
        h_env.record(t1 - t0)
        h_host.record(clock() - t1)
        replay.count_captured(added=vector_steps * n)
        step += vector_steps * n
        ctx.accounting.produced += vector_steps * n
        ctx.accounting.stored += vector_steps * n

        launches = (updates_owed(hp, step) - updates) // per_launch
        if launches:
            beta.fill_(beta_at(hp, step, budget.total_steps))
            t0 = clock()
            for _ in range(launches):
                learner_launch()
            h_learn.record(clock() - t0)
            learner_launches += launches
            updates += launches * per_launch
            learner.updates += launches * per_launch
        ctx.evaluate_if_due(step, learner)
        if time.perf_counter() >= next_progress:
            budget.progress(step)
            next_progress = time.perf_counter() + PROGRESS_EVERY_S

    rest = updates_owed(hp, step) - updates  # below one launch: uncaptured, so the total is the local loop's
    if rest > 0:
        beta.fill_(beta_at(hp, step, budget.total_steps))
        learner.device_updates(replay, rest, beta)
        updates += rest
        learner.updates += rest
    replay.check_flags()  # waits for the last launches
    stats.last_step_t = time.perf_counter()
    replay.count_captured(samples=updates, sampled_items=updates * hp.batch_size, updates=updates,
                          updated_items=updates * hp.batch_size)

    actor = ctx.actor = ctx.algorithm.make_actor(spec, compute, hp, seed)  # evaluated greedily by the runner
    actor.load_weights(learner.weights(), learner.updates)
    stats.env_steps, stats.updates, stats.samples = step, updates, updates * hp.batch_size
    stats.extra.update({
        "updates_per_launch": per_launch, "env_steps_per_launch": steps_per_launch,
        "capture": env_launch.describe() if hasattr(env_launch, "describe") else type(env_launch).__name__,
        "launches": {"env": env_launches, "learner": learner_launches},
        "uncaptured": {"env_steps": uncaptured_env_steps, "updates": max(0, rest)},
        "samples_per_insert": stats.samples / step if step else 0.0,
        "note": "launch latencies are host time: on CUDA a launch returns before the device finishes; "
                "episodes.to_host includes waiting for it",
    })
    return stats


class DeviceEpisodes:
    """Episode returns and lengths accumulated on the device. Row r of a launch records, per env, the
    return and length of an episode that ended at the launch's r-th step (length 0: none ended);
    `to_curve` brings a launch's rows to the host in one copy."""

    def __init__(self, num_envs: int, rows: int, device: Any) -> None:
        import torch

        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.ended = torch.zeros((2, rows, num_envs), dtype=torch.float64, device=device)  # returns, lengths

    def record(self, row: int, rewards: Any, ended: Any) -> None:
        import torch

        self.returns += rewards
        self.lengths += 1
        self.ended[0, row] = torch.where(ended, self.returns, 0.0)
        self.ended[1, row] = torch.where(ended, self.lengths, 0).to(torch.float64)
        self.returns.masked_fill_(ended, 0.0)
        self.lengths.masked_fill_(ended, 0)

    def to_curve(self, curve: Any, step: int, rows: int) -> None:
        """Every episode that ended in the launch's first `rows` steps, at the env step it ended on
        (as the local loop records it); `step`: env steps before the launch."""
        returns, lengths = self.ended[:, :rows].cpu().numpy()
        num_envs = returns.shape[1]
        for row, env in zip(*np.nonzero(lengths)):
            curve.episode(step + (int(row) + 1) * num_envs, float(returns[row, env]), int(lengths[row, env]))
