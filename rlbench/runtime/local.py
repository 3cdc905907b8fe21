"""The single-process loops (placement `local`): the replay loop of DQN and DDPG, and the tabular
loop of Q-learning and SARSA, online or offline.

Replay loop. PEARL's protocol in one process: the actor inserts transitions (new ones get the max
priority), the learner samples, learns, sends priorities back, and publishes weights to the actor
every `publish_every` updates. `train_every` env steps per update fixes the samples-per-insert
ratio, the same quantity the distributed runtime's rate limiter enforces, so the two are comparable.
Data stays where the components keep it: an environment that hands out device tensors feeds the
actor and a device replay memory directly; only episode bookkeeping (rewards and ends, a few
numbers per env) and a host memory's inserts are copied to the host.

Tabular loop. Online: one process steps the environment batch, the actor picks actions
epsilon-greedily from the learner's latest table, and every transition is applied as one TD update
as soon as it is seen (published to the actor after each update). For SARSA the next action a' is
chosen before the update and then executed, which makes it on-policy; Q-learning ignores it.
Offline (ctx.config.dataset = N, SwiftRL's workload): the dataset of N transitions for the
environment, behaviour and seed is loaded (collected once and cached), and the learner sweeps it
hp.epochs times through the engine's fit_offline.

Either way ctx.actor ends holding the final policy; the runner evaluates it greedily.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from rlbench.algorithms.common import beta_at
from rlbench.arrays import as_float32, to_host
from rlbench.errors import RlbenchError
from rlbench.protocols import Sample
from rlbench.metrics import time_split
from rlbench.runtime.context import LoopStats, RunContext
from rlbench.runtime.transitions import transition

PROGRESS_EVERY_S = 0.25
LOCAL_TIMES = {"env.step": "env", "actor.inference": "inference", "learner.update": "learner", "replay.add": "replay",
               "replay.sample": "replay", "replay.update_priorities": "replay", "weights.publish": "weights"}
PROGRESS_EVERY = 1024  # tabular loop iterations between budget.progress calls


def run_replay_loop(ctx: RunContext) -> LoopStats:
    hp, env, replay, budget, recorder = ctx.hp, ctx.env, ctx.replay, ctx.budget, ctx.recorder
    spec = env.spec
    seed = ctx.config.seed
    actor = ctx.actor = ctx.algorithm.make_actor(spec, ctx.compute, hp, seed)
    learner = ctx.algorithm.make_learner(spec, ctx.compute, hp, seed)
    actor.load_weights(learner.weights(), learner.updates)
    prioritized = ctx.replay_capabilities.prioritized
    for_replay = (lambda array: array) if ctx.replay_capabilities.accepts_tensors else to_host

    h_act, h_env = recorder.histogram("actor.inference"), recorder.histogram("env.step")
    h_add, h_sample = recorder.histogram("replay.add"), recorder.histogram("replay.sample")
    h_learn, h_prio = recorder.histogram("learner.update"), recorder.histogram("replay.update_priorities")
    h_publish = recorder.histogram("weights.publish")
    clock = time.perf_counter_ns

    n = spec.num_envs
    episode_return = np.zeros(n, dtype=np.float64)
    episode_length = np.zeros(n, dtype=np.int64)
    stats = LoopStats()
    step = 0
    next_update_at = max(hp.learning_starts, hp.batch_size)
    next_progress = time.perf_counter() + PROGRESS_EVERY_S
    obs = env.reset(seed=seed)
    stats.first_step_t = time.perf_counter()  # start-up (imports, building the networks) ends here

    while not budget.exhausted(step):
        t0 = clock()
        actions = actor.act(obs, step)
        t1 = clock()
        result = env.step(actions)
        t2 = clock()
        rewards = for_replay(result.rewards)
        replay.add(transition(for_replay(obs), for_replay(actions), rewards, for_replay(result.final_observations),
                              for_replay(as_float32(result.terminated))))
        t3 = clock()
        h_act.record(t1 - t0)
        h_env.record(t2 - t1)
        h_add.record(t3 - t2)
        ctx.accounting.produced += n
        ctx.accounting.stored += n
        step += n

        episode_return += to_host(rewards)  # no second copy when the memory already got host rewards
        episode_length += 1
        ended = to_host(result.terminated | result.truncated)
        if ended.any():
            for i in np.flatnonzero(ended):
                ctx.curve.episode(step, episode_return[i], episode_length[i])
            episode_return[ended] = 0.0
            episode_length[ended] = 0
        obs = result.observations

        while step >= next_update_at:
            next_update_at += hp.train_every
            t0 = clock()
            sample = replay.sample(hp.batch_size, beta_at(hp, step, budget.total_steps))
            t1 = clock()
            priorities, _ = learner.update(sample)
            t2 = clock()
            h_sample.record(t1 - t0)
            h_learn.record(t2 - t1)
            if prioritized:
                replay.update_priorities(sample.indices, priorities)
                h_prio.record(clock() - t2)
            stats.updates += 1
            stats.samples += hp.batch_size
            if stats.updates % hp.publish_every == 0:
                t0 = clock()
                actor.load_weights(learner.weights(), learner.updates)
                h_publish.record(clock() - t0)
        ctx.evaluate_if_due(step, learner)

        if time.perf_counter() >= next_progress:
            budget.progress(step)
            next_progress = time.perf_counter() + PROGRESS_EVERY_S

    stats.last_step_t = time.perf_counter()
    stats.extra["time_split"] = {"local": time_split(recorder, stats.last_step_t - stats.first_step_t, LOCAL_TIMES)}
    actor.load_weights(learner.weights(), learner.updates)  # evaluate the final policy
    stats.env_steps = step
    stats.extra["samples_per_insert"] = stats.samples / step if step else 0.0
    return stats


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
    first_step_t = time.perf_counter()
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
        batch = {**transition(obs, actions, result.rewards, result.final_observations, result.terminated),
                 "next_action": bootstrap_actions}  # SARSA's a'; Q-learning ignores it
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
        ctx.evaluate_if_due(step, learner)
        iterations += 1
        if iterations % PROGRESS_EVERY == 0:
            ctx.budget.progress(step)
    ctx.budget.progress(step)
    return LoopStats(env_steps=step, updates=learner.updates, samples=step, first_step_t=first_step_t,
                     last_step_t=time.perf_counter(),
                     extra={"mode": "online", "rule": learner.rule, "final_epsilon": actor.epsilon(step)})


def _run_offline(ctx: RunContext) -> LoopStats:
    from rlbench import datasets

    spec = ctx.env.spec
    size, behaviour, seed = int(ctx.config.dataset), ctx.config.behaviour, ctx.config.seed
    if behaviour not in datasets.BEHAVIOURS:
        raise RlbenchError(f"unknown dataset behaviour {behaviour!r}; choose one of {', '.join(datasets.BEHAVIOURS)}")
    options = ctx.options.get("environment", {})
    t0 = time.perf_counter()
    path = datasets.cache_path(ctx.config.env, size, behaviour, seed, options)
    cached = path.exists()
    dataset = datasets.get(ctx.config.env, size, behaviour=behaviour, seed=seed, options=options)
    load_seconds = time.perf_counter() - t0
    if (dataset.n_states, dataset.n_actions) != (spec.n_states, spec.n_actions):
        raise RlbenchError(f"dataset {path} was collected from a ({dataset.n_states}, {dataset.n_actions}) table, but "
                           f"{spec.id} with options {options or 'none'} now has ({spec.n_states}, {spec.n_actions}): "
                           "the environment changed since (another version of it); delete the file to collect it again")

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
