"""Run one configuration end to end: validate, build, train, evaluate, measure, write the result."""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from rlbench.arrays import to_host
from rlbench.config import RunConfig, actor_compute_of, run_hyperparameters
from rlbench.energy import EnergyMeters
from rlbench.machine_state import own_cpu_s, watch
from rlbench.fingerprint import machine_fingerprint
from rlbench.plugins import call_hook_safely, get_registry
from rlbench.registry import Registry
from rlbench.results import SCHEMA, check_writable, write
from rlbench.metrics import Recorder, bookkeeping_share
from rlbench.errors import STOP_SIGNALS, RlbenchError, SignalInterrupt
from rlbench.runtime.context import Accounting, Budget, LearningCurve, LoopStats, PeriodicEvaluation, RunContext
from rlbench.version import __version__
from rlbench.validate import Plan, validate, validate_hyperparameters, validate_messages, validate_policy

EVAL_SEED_OFFSET = 1_000_003  # evaluation episodes never reuse training seeds


def stop_series_if_signalled(result: dict[str, Any]) -> dict[str, Any]:
    """`result`, unless a stop signal ended its run: then SignalInterrupt. For commands that run one
    run after another (profile, plan's validation, benchmarks): the runner takes the signal to stop
    the run in progress in order, so without this the next run would start, and such a command could
    only be stopped by a second signal landing in the same run."""
    if result.get("stop_signal"):
        raise SignalInterrupt(result["stop_signal"], "while a run of a series was in progress: it stopped in order, "
                                                     "and no further run started")
    return result


@contextmanager
def _signals_stop(budget: Budget) -> Iterator[None]:
    """The first Ctrl-C, SIGTERM or SIGHUP asks the run to stop in order (its result is still written,
    marked incomplete with the signal named); a second one interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if budget.interrupted:
            raise SignalInterrupt(signum)
        budget.interrupted = STOP_SIGNALS[signum]
        budget.stop_signal = signum

    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def evaluate(actor: Any, plan: Plan, config: RunConfig, episodes: int) -> dict[str, Any]:
    """Greedy episodes on a fresh environment, in its evaluation mode where it has one (Atari: whole
    games scored raw, where training clips rewards and ends an episode per life); `returns` says what
    a return counts. Success (toy text) = the episode terminated on a positive reward, i.e. the goal
    was reached."""
    options = dict(plan.options.get("environment", {}))
    if plan.environment.capabilities.evaluation_mode:
        options["evaluation"] = True
    env = plan.environment.create(num_envs=1, seed=config.seed + EVAL_SEED_OFFSET, **options)
    tabular = env.spec.n_states is not None
    returns, successes = [], 0
    try:
        obs = env.reset(seed=config.seed + EVAL_SEED_OFFSET)
        total = 0.0
        while len(returns) < episodes:
            result = env.step(actor.greedy(to_host(obs)))  # greedy() is the host path; a device env's obs come over
            total += float(result.rewards[0])
            if result.terminated[0] or result.truncated[0]:
                returns.append(total)
                successes += bool(result.terminated[0] and result.rewards[0] > 0)
                total = 0.0
            obs = result.observations
    finally:
        env.close()
    values = np.asarray(returns, dtype=np.float64)
    return {"episodes": episodes, "mean_return": float(values.mean()), "std_return": float(values.std()),
            "min_return": float(values.min()), "max_return": float(values.max()),
            "success_rate": successes / episodes if tabular else None, "returns": env.spec.returns}


def _select_loop(plan: Plan, ctx: RunContext) -> tuple[str, Callable[[RunContext], LoopStats], str | None]:
    """(the loop's name for result["loop"]["name"], the loop, why the one-device loop was not chosen
    when a component runs on an accelerator, else None)."""
    if plan.algorithm.capabilities.loop == "replay":
        from rlbench.runtime import device_loop

        devices = {kind: getattr(component.capabilities, "device", None) for kind, component in
                   (("environment", plan.environment), ("replay memory", plan.replay), ("compute", plan.compute))}
        why_not = device_loop.refusal(ctx, devices)
        if why_not is None:
            return device_loop.NAME, device_loop.run_device_loop, None
        from rlbench.runtime.local import run_replay_loop

        on_accelerator = any(device not in device_loop.HOST_DEVICES for device in devices.values())
        return "replay", run_replay_loop, why_not if on_accelerator else None
    from rlbench.runtime.local import run_tabular_loop

    return "tabular", run_tabular_loop, None


def _check_eval_every(config: RunConfig) -> None:
    """--eval-every runs inside the single-process loop; a distributed run's roles have no such hook
    (its evaluation would belong in the launcher, which polls the node and can fetch the published
    weights, so neither the learner nor the actors pay for it)."""
    every = config.eval_every
    if every is None:
        return
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise RlbenchError(f"--eval-every takes a positive number of env steps, got {every!r}")
    if config.placement != "local":
        raise RlbenchError(f"--eval-every is supported with --placement local only, not {config.placement}: "
                           "drop --eval-every (the final greedy evaluation is still in the result) or run "
                           "--placement local")
    if config.dataset:
        raise RlbenchError("--eval-every counts env steps, and an offline run (--dataset) takes none: drop one of them")
    if config.eval_episodes < 1:
        raise RlbenchError("--eval-every needs --eval-episodes of at least 1 (the episodes of each evaluation)")


def check(config: RunConfig, registry: Registry) -> tuple[Plan, Any, Any]:
    """Everything `run` refuses before it starts, in one place: (plan, algorithm, hyperparameters),
    or an RlbenchError saying what is wrong and what would work."""
    plan = validate(config, registry)
    _check_eval_every(config)
    algorithm = plan.algorithm.create()
    hp = run_hyperparameters(algorithm, config, registry)
    validate_hyperparameters(hp)
    validate_policy(config, plan, hp)
    validate_messages(config, plan, algorithm, hp, registry)
    return plan, algorithm, hp


def run(config: RunConfig, *, registry: Registry | None = None,
        progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run `config`; returns the result document (also written when config.out is set).

    Raises RlbenchError before anything starts when the combination is invalid.
    """
    registry = registry or get_registry()
    # before the check: a plugin whose fingerprint raises is refused, and a run that needs it with it;
    # and before the run: plugins' fingerprints import native modules (pyopencl), and a second Ctrl-C
    # or SIGTERM raised inside such an import at the end of a run aborted the process instead of exiting 130/143
    fingerprint = machine_fingerprint(registry)
    plan, algorithm, hp = check(config, registry)
    if config.out:
        check_writable(config.out)
    if config.checkpoint_every or config.resume:
        from rlbench.runtime import checkpoint

        config = checkpoint.prepared(config)
    call_hook_safely("rlbench_run_configured", config=config)
    total_steps = config.steps if config.steps is not None else hp.total_steps
    budget = Budget(total_steps=total_steps, seconds=config.seconds,
                    on_progress=(lambda step: progress(step, total_steps)) if progress else None)
    with _signals_stop(budget):  # from here on, a stop signal ends the run with a result
        return _build_and_run(config, plan, algorithm, hp, budget, progress, fingerprint)


@dataclass
class _Trained:
    """What a training phase hands to result assembly, whichever placement ran it."""

    stats: LoopStats
    recorder: Recorder
    accounting: Accounting
    curve: LearningCurve
    actor: Any  # evaluated greedily afterwards (None: nothing to evaluate)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop_reason: str = ""
    replay_stats: dict[str, Any] | None = None
    evaluation: PeriodicEvaluation | None = None  # --eval-every's points
    returns: str | None = None  # what a training episode's return counts (EnvSpec.returns; None: no env was built)


def _train_local(config: RunConfig, plan: Plan, algorithm: Any, hp: Any, budget: Budget) -> _Trained:
    compute = plan.compute.create(**plan.options.get("compute", {}))
    env = plan.environment.create(num_envs=config.num_envs, seed=config.seed, **plan.options.get("environment", {}))
    replay = None
    if plan.replay is not None:
        from rlbench.runtime.transitions import make_memory

        replay = make_memory(plan.replay, env.spec, capacity=hp.buffer_size, alpha=hp.per_alpha, seed=config.seed,
                             options=plan.options.get("replay", {}))
    ctx = RunContext(config=config, algorithm=algorithm, hp=hp, env=env, compute=compute, replay=replay,
                     budget=budget, replay_capabilities=plan.replay.capabilities if plan.replay else None,
                     options=plan.options)
    if config.eval_every:
        ctx.evaluation = PeriodicEvaluation(
            config.eval_every, lambda actor: evaluate(actor, plan, config, config.eval_episodes),
            lambda: algorithm.make_actor(env.spec, compute, hp, config.seed))
    stats = LoopStats()
    name, loop, not_device = _select_loop(plan, ctx)
    try:
        stats = loop(ctx)
    except KeyboardInterrupt:
        budget.interrupted = budget.interrupted or STOP_SIGNALS[signal.SIGINT]
        stats.env_steps = ctx.accounting.produced
    finally:
        env.close()
    stats.extra = {"name": name, **({"device_loop_not_chosen": not_device} if not_device else {}), **stats.extra}
    return _Trained(stats, ctx.recorder, ctx.accounting, ctx.curve, ctx.actor,
                    notes=[env.spec.note] if env.spec.note else [],
                    replay_stats=replay.stats() if replay is not None else None, evaluation=ctx.evaluation,
                    returns=env.spec.returns)


def _train_distributed(config: RunConfig, plan: Plan, algorithm: Any, hp: Any, budget: Budget) -> _Trained:
    from rlbench.runtime.distributed.driver import run_distributed

    outcome = run_distributed(config, plan, hp, budget)
    actor, returns = None, None
    if outcome.final_weights is not None:
        env = plan.environment.create(num_envs=1, seed=config.seed, **plan.options.get("environment", {}))
        env.close()
        returns = env.spec.returns
        compute = plan.compute.create(**plan.options.get("compute", {}))
        actor = algorithm.make_actor(env.spec, compute, hp, config.seed)
        actor.load_weights(outcome.final_weights, outcome.weights_version)
    outcome.stats.extra = {"name": "distributed", **outcome.stats.extra, "failures": outcome.failures}
    return _Trained(outcome.stats, outcome.recorder, outcome.accounting, outcome.curve, actor,
                    failures=outcome.failures, stop_reason=outcome.stop_reason,
                    replay_stats=outcome.stats.extra.get("replay_memory"), returns=returns)


def _steady(stats: LoopStats, t0: float, evaluating_s: float = 0.0) -> dict[str, float | None]:
    """Rates over the steady window (first to last env step, less the time spent evaluating) and the
    start-up before it; None when the run has no such window (offline learning, or a run that never
    stepped)."""
    first, last = stats.first_step_t, stats.last_step_t
    if first is None or last is None or last - evaluating_s <= first:
        return {"startup_s": None, "env_steps_per_s": None, "updates_per_s": None}
    window = last - first - evaluating_s
    return {"startup_s": stats.startup_s if stats.startup_s is not None else first - t0,
            "env_steps_per_s": stats.env_steps / window, "updates_per_s": stats.updates / window}


def _build_and_run(config: RunConfig, plan: Plan, algorithm: Any, hp: Any, budget: Budget,
                   progress: Callable[[int, int], None] | None, fingerprint: dict[str, Any]) -> dict[str, Any]:
    total_steps = budget.total_steps
    meters = EnergyMeters(config)
    started_unix = time.time()
    cpu0 = own_cpu_s()
    meters.start()
    t0 = time.perf_counter()
    train = _train_local if config.placement == "local" else _train_distributed
    busy = 1 if config.placement == "local" else config.actors + 1 + config.learners  # actors, replay node, learners
    with watch(busy_processes=busy) as machine:
        trained = train(config, plan, algorithm, hp, budget)
    stats = trained.stats
    status, reason = "complete", None
    if budget.interrupted:
        status, reason = "incomplete", budget.interrupted
    elif trained.stop_reason:
        status, reason = "incomplete", trained.stop_reason
    wall = time.perf_counter() - t0
    energy = meters.stop({"samples": stats.samples, "env_steps": stats.env_steps})
    # this process, the processes it joined, and the fork server's (a distributed run's roles are its children)
    cpu = own_cpu_s() - cpu0
    if progress:
        progress(stats.env_steps, total_steps)
    notes = plan.notes + trained.notes + [f"failure: {f}" for f in trained.failures]
    if machine.warning:
        notes.append("warning: " + machine.warning)
    periodic = trained.evaluation
    evaluating_s = periodic.seconds if periodic else 0.0
    steady = _steady(stats, t0, evaluating_s)
    training_s = wall - evaluating_s  # rates count training only, not --eval-every's episodes

    evaluation = None
    training_cpu_s = periodic.training_cpu_s() if periodic else None
    if status == "complete" and trained.actor is not None and config.eval_episodes > 0:
        evaluation = evaluate(trained.actor, plan, config, config.eval_episodes)
    evaluation_curve = None
    if periodic is not None:
        if evaluation is not None:  # the final evaluation closes the curve
            periodic.record(stats.env_steps, stats.updates, (stats.last_step_t or time.perf_counter()) - trained.curve.t0,
                            training_cpu_s, evaluation)
        evaluation_curve = {"every": periodic.every, "episodes": config.eval_episodes, "points": periodic.points,
                            "seconds": periodic.seconds, "cpu_s": periodic.cpu_s}

    written = stats.extra.pop("checkpoints", None)
    resumed_from = stats.extra.pop("resumed_from", None)
    resolved = config.to_dict()
    resolved["replay"] = plan.replay.name if plan.replay else None
    resolved["actor_compute"] = actor_compute_of(config)  # each role's backend, said (--actor-compute)
    resolved["total_steps"] = total_steps
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "rlbench_version": __version__,
        "status": status,
        "status_reason": reason,
        "stop_signal": budget.stop_signal or None,
        "notes": notes,
        "config": resolved,
        "hyperparameters": dataclasses.asdict(hp),
        "components": {kind: {"name": c.name, "plugin": c.plugin, "description": c.description}
                       for kind, c in plan.selected().items()},
        "fingerprint": fingerprint,
        "timing": {"started_unix": started_unix, "wall_s": wall, "cpu_s": cpu,
                   "cpu_utilisation": cpu / wall if wall > 0 else math.nan, "startup_s": steady["startup_s"],
                   "evaluating_s": evaluating_s, "evaluating_cpu_s": periodic.cpu_s if periodic else 0.0},
        "throughput": {
            "env_steps": stats.env_steps, "updates": stats.updates, "samples": stats.samples,
            # over the whole run, start-up included, --eval-every's evaluations not;
            # `steady_*`: between the first and the last env step
            "env_steps_per_s": stats.env_steps / training_s if training_s > 0 else math.nan,
            "updates_per_s": stats.updates / training_s if training_s > 0 else math.nan,
            "samples_per_s": stats.samples / training_s if training_s > 0 else math.nan,
            "steady_env_steps_per_s": steady["env_steps_per_s"],
            "steady_updates_per_s": steady["updates_per_s"],
        },
        "machine_state": machine.report(),
        "latency": trained.recorder.latency_summary(),
        "latency_histograms": {name: h.to_dict() for name, h in trained.recorder.histograms.items() if h.count},
        "counters": dict(trained.recorder.counters),
        "learning_curve": trained.curve.points,
        "evaluation": evaluation,
        # what a return counts in each: "raw" (the environment's rewards, an episode as it defines one), or
        # the training environment's description (Atari trains on clipped rewards, an episode per life, and
        # is evaluated on whole games' raw scores)
        "returns": {"learning_curve": trained.returns, "evaluation": evaluation["returns"] if evaluation else None},
        "evaluation_curve": evaluation_curve,
        "energy": energy,
        "accounting": trained.accounting.to_dict(),
        "loop": {k: v for k, v in stats.extra.items() if k != "modelled"},
        "bookkeeping_share": bookkeeping_share(stats.extra.get("time_split", {})),
        "modelled": stats.extra.get("modelled", {}),
        "replay_stats": trained.replay_stats,
        # the checkpoints this run wrote (directory, each one's number, env step and the node's seconds),
        # and the one it continued: a resumed run's throughput counts its own env steps only
        "checkpoints": {"directory": config.checkpoint_dir, "every_s": config.checkpoint_every, "written": written or []}
        if config.checkpoint_every else None,
        "resumed_from": resumed_from,
    }
    path = None
    if config.out:
        path = str(write(result, config.out))
        result["path"] = path
    call_hook_safely("rlbench_run_finished", result=result, path=path)
    return result
