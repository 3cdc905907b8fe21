"""The runtime loop of tabular algorithms (Q-learning, SARSA), online or offline.

Online: one process steps the environment batch, the actor picks actions epsilon-greedily from the
learner's latest table, and every transition is applied as one TD update as soon as it is seen
(published to the actor after each update). For SARSA the next action a' is chosen before the
update and then executed, which makes it on-policy; Q-learning ignores it.

Offline (ctx.config.dataset = N, SwiftRL's workload): the dataset of N transitions for the
environment, behaviour and seed is loaded (collected once and cached), and the learner sweeps it
hp.epochs times through the engine's fit_offline.

Either way ctx.actor ends holding the final table; the runner evaluates it greedily.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from rlbench.errors import RlbenchError
from rlbench.protocols import Sample
from rlbench.runtime.context import LoopStats, RunContext

PROGRESS_EVERY = 1024  # loop iterations between budget.progress calls


def run_tabular_loop(ctx: RunContext) -> LoopStats:
    if ctx.config.dataset:
        return _run_offline(ctx)
    return _run_online(ctx)


def _run_online(ctx: RunContext) -> LoopStats:
    env, spec = ctx.env, ctx.env.spec
    # The exploration schedule spans the run's own step budget, whatever the Config default says.
    hp = dataclasses.replace(ctx.hp, total_steps=ctx.budget.total_steps)
    actor = ctx.algorithm.make_actor(spec, ctx.compute, hp, ctx.config.seed)
    learner = ctx.algorithm.make_learner(spec, ctx.compute, hp, ctx.config.seed)
    actor.load_weights(learner.weights(), learner.updates)
    ctx.actor = actor
    update_latency = ctx.recorder.histogram("learner.update")

    n = spec.num_envs
    all_rows = np.arange(n, dtype=np.int64)
    ones = np.ones(n, dtype=np.float32)
    episode_return = np.zeros(n)
    episode_length = np.zeros(n, dtype=np.int64)
    obs = env.reset(seed=ctx.config.seed)
    step = 0
    actions = actor.act(obs, step)
    iterations = 0
    while not ctx.budget.exhausted(step):
        result = env.step(actions)
        step += n
        ctx.accounting.produced += n
        ended = result.terminated | result.truncated
        # a' at the true next state: the action about to be executed, except where an episode ended
        # and the environment has already reset (a truncated episode still bootstraps from it).
        next_actions = actor.act(result.observations, step)
        bootstrap_actions = next_actions.copy()
        if ended.any():
            bootstrap_actions[ended] = actor.act(result.final_observations[ended], step)
        batch = {"obs": obs, "action": actions, "reward": result.rewards, "next_obs": result.final_observations,
                 "next_action": bootstrap_actions, "done": result.terminated}
        t0 = time.perf_counter_ns()
        learner.update(Sample(indices=all_rows, transitions=batch, weights=ones))
        update_latency.record(time.perf_counter_ns() - t0)
        ctx.accounting.stored += n
        actor.load_weights(learner.weights(), learner.updates)

        episode_return += result.rewards
        episode_length += 1
        if ended.any():
            for i in np.flatnonzero(ended):
                ctx.curve.episode(step, float(episode_return[i]), int(episode_length[i]))
            episode_return[ended] = 0.0
            episode_length[ended] = 0
        obs, actions = result.observations, next_actions
        iterations += 1
        if iterations % PROGRESS_EVERY == 0:
            ctx.budget.progress(step)
    ctx.budget.progress(step)
    return LoopStats(env_steps=step, updates=learner.updates, samples=step,
                     extra={"mode": "online", "rule": learner.rule, "final_epsilon": actor.epsilon(step)})


def _run_offline(ctx: RunContext) -> LoopStats:
    from rlbench import datasets

    spec = ctx.env.spec
    size, behaviour, seed = int(ctx.config.dataset), ctx.config.behaviour, ctx.config.seed
    if behaviour not in datasets.BEHAVIOURS:
        raise RlbenchError(f"unknown dataset behaviour {behaviour!r}; choose one of {', '.join(datasets.BEHAVIOURS)}")
    t0 = time.perf_counter()
    path = datasets.cache_path(spec.id, size, behaviour, seed)
    cached = path.exists()
    dataset = datasets.get(spec.id, size, behaviour=behaviour, seed=seed)
    load_seconds = time.perf_counter() - t0
    if (dataset.n_states, dataset.n_actions) != (spec.n_states, spec.n_actions):
        raise RlbenchError(f"dataset {path} has a ({dataset.n_states}, {dataset.n_actions}) table but {spec.id} "
                           f"has ({spec.n_states}, {spec.n_actions}); delete the file to collect it again")

    learner = ctx.algorithm.make_learner(spec, ctx.compute, ctx.hp, seed)
    with ctx.recorder.time("learner.fit_offline"):
        measured = learner.fit_offline(dataset.arrays, epochs=ctx.hp.epochs)
    ctx.accounting.produced += len(dataset)
    ctx.accounting.stored += len(dataset)
    actor = ctx.algorithm.make_actor(spec, ctx.compute, ctx.hp, seed)
    actor.load_weights(learner.weights(), learner.updates)
    ctx.actor = actor
    ctx.budget.progress(0)
    extra = {
        "mode": "offline",
        "rule": learner.rule,
        "dataset": {"size": len(dataset), "env_id": dataset.env_id, "behaviour": dataset.behaviour,
                    "seed": dataset.seed, "path": str(path), "key": path.stem, "cached": cached,
                    "nbytes": dataset.nbytes, "episodes": dataset.meta.get("episodes"),
                    "load_or_collect_s": round(load_seconds, 4)},
        "epochs": ctx.hp.epochs,
        "engine": measured,
    }
    return LoopStats(env_steps=0, updates=learner.updates, samples=len(dataset) * ctx.hp.epochs, extra=extra)
