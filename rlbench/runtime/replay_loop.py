"""The single-process actor -> replay -> learner loop (placement `local`).

PEARL's protocol in one process: the actor inserts transitions (new ones get the max priority), the
learner samples, learns, sends priorities back, and publishes weights to the actor every
`publish_every` updates. `train_every` env steps per update fixes the samples-per-insert ratio, the
same quantity the distributed runtime's rate limiter enforces, so the two are comparable.

Data stays where the components keep it: an environment that hands out device tensors feeds the
actor and a device replay memory directly; only episode bookkeeping (rewards and ends, a few
numbers per env) and a host memory's inserts are copied to the host.
"""

from __future__ import annotations

import time

import numpy as np

from rlbench.arrays import as_float32, to_host
from rlbench.runtime.context import LoopStats, RunContext

PROGRESS_EVERY_S = 0.25


def beta_at(hp, step: int, total_steps: int) -> float:
    """Importance-sampling exponent, annealed linearly over the run (Schaul et al.)."""
    fraction = min(1.0, step / max(1, total_steps))
    return hp.per_beta_start + fraction * (hp.per_beta_end - hp.per_beta_start)


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

    while not budget.exhausted(step):
        t0 = clock()
        actions = actor.act(obs, step)
        t1 = clock()
        result = env.step(actions)
        t2 = clock()
        rewards = for_replay(result.rewards)
        replay.add({"obs": for_replay(obs), "action": for_replay(actions), "reward": rewards,
                    "next_obs": for_replay(result.final_observations),
                    "done": for_replay(as_float32(result.terminated))})
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

        if time.perf_counter() >= next_progress:
            budget.progress(step)
            next_progress = time.perf_counter() + PROGRESS_EVERY_S

    actor.load_weights(learner.weights(), learner.updates)  # evaluate the final policy
    stats.env_steps = step
    stats.extra["samples_per_insert"] = stats.samples / step if step else 0.0
    return stats
