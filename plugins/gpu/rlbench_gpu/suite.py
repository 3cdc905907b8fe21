"""`rlbench gpu bench`: issue #22's target figures, each measured in one run beside its CPU peer on
the same machine and beside plain-torch references (rlbench_gpu.reference: eager, and captured).

Figures (targets are an H100's; on another device a figure is printed, never judged):
  dqn_updates    DQN updates/s, MLP 4-128-128-2, batch 128, prioritized replay on the device
  replay_cycles  replay sample + priority update cycles/s, 1M items, batch 256, inside the captured step
  env_steps      gpu/CartPole-v1 env steps/s, 4096 envs, actions from the DQN policy
  dqn_e2e        DQN CartPole end to end (rlbench.run), env steps/s against the CPU run
  ddpg_e2e       DDPG Pendulum end to end (rlbench.run), env steps/s against the CPU run
Every row says where it ran and is `measured`; on the CPU device every figure is labelled NOT a GPU
figure, and what needs CUDA says so instead of a number. Each rate is the median of ROUNDS rounds,
each round ending with a device synchronize; a captured subject's start-up (warm-up, capture,
compile) is timed apart. `ops/unit` counts the computing aten ops one update, cycle or env step
dispatches (rlbench_gpu.audit: about one kernel launch each on CUDA). NVML joules per 1M env steps
(or per 1M updates/cycles where no env steps) where NVML reads the GPU, else the reason.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

ROUNDS = 5
PER_LAUNCH = 8  # K, as the DQN/DDPG default (hyperparameter updates_per_launch)
ENV_STEPS_PER_LAUNCH = 16  # S, as the default (env_steps_per_launch)
PROFILED_LAUNCHES = 20  # --profile: launches traced per captured subject
PROFILE_TOP = 6  # --profile: the costliest kernels (ops) named per subject
TARGETS = {  # issue #22, on an H100
    "dqn_updates": ("DQN updates/s, MLP 4-128-128-2, batch 128, prioritized replay on the device", 25_000.0),
    "replay_cycles": ("replay sample(256) + update cycles/s, 1M items, inside the captured step", 50_000.0),
    "env_steps": ("gpu/CartPole-v1 env steps/s, 4096 envs, DQN policy actions", 150e6),
    "dqn_e2e": ("DQN CartPole end to end: env steps/s, x the CPU run", 20.0),
    "ddpg_e2e": ("DDPG Pendulum end to end: env steps/s, x the CPU run", 10.0),
}
# and learns: greedy return at least this (DQN: within 60 s of wall time), judged with --full's evaluation
RETURN_TARGETS = {"dqn_e2e": (475.0, 60.0), "ddpg_e2e": (-200.0, None)}


@dataclass
class Row:
    subject: str
    where: str
    rate: float | None = None  # per second, in the figure's unit
    unit: str = ""
    label: str = "measured"
    ops_per_unit: int | None = None
    startup_s: float | None = None
    joules_per_million: float | None = None
    energy_note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] | None = None  # --profile: where a launch's time goes (Bench.profile)


@dataclass
class Figure:
    key: str
    title: str
    target: float
    rows: list[Row] = field(default_factory=list)
    peer: str = ""  # the subject whose rate the others are compared with
    conditions: str = ""  # this run's sizes, where they differ from the target's
    judged: str = ""  # the target met or not, or why it is not judged here
    error: str = ""  # why the figure failed to measure ("" when it did): its one row says so too


class Bench:
    def __init__(self, device: Any, seconds: float, capture: str, label: str, profiling: bool = False) -> None:
        import torch

        from rlbench_gpu.device import synchronize

        self.torch, self.device, self.seconds, self.capture = torch, device, seconds, capture
        self.profiling = profiling
        self.on_cuda = device.type == "cuda"
        self.where = str(device)
        self.label = "measured" if self.on_cuda else "measured, CPU device: NOT a GPU figure"
        self.sync = lambda: synchronize(device)
        self.device_label = label
        self.energy_reason = ""
        if not self.on_cuda:
            self.energy_reason = "no NVML reading on the CPU device"
        else:
            from rlbench_gpu.energy import NvmlMeter

            probe = NvmlMeter(device.index or 0)
            self.energy_reason = probe.reason
            probe.close()

    # -- measuring ------------------------------------------------------------------------------------
    def rate(self, call: Callable[[], Any], per_call: int, *, sync: Callable[[], None] | None = None,
             energy_per: str = "") -> tuple[float, float | None, str]:
        """(median items/s over ROUNDS rounds, joules per 1M items or None, why none). One warm call first."""
        sync = sync or self.sync
        call()
        sync()
        meter = self._meter() if energy_per else None
        rates, items = [], 0
        for _ in range(ROUNDS):
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < self.seconds / ROUNDS:
                call()
                calls += 1
            sync()
            rates.append(calls * per_call / (time.perf_counter() - start))
            items += calls * per_call
        joules, why = None, self.energy_reason if energy_per else ""
        if meter is not None:
            reading = meter.stop()
            meter.close()
            if reading.get("joules") is not None:
                joules, why = reading["joules"] / items * 1e6, ""
            else:
                why = reading.get("reason", "")
        return statistics.median(rates), joules, why

    def _meter(self) -> Any:
        if not self.on_cuda or self.energy_reason:
            return None
        from rlbench_gpu.energy import NvmlMeter

        meter = NvmlMeter(self.device.index or 0)
        meter.start()
        return meter

    def startup(self, launch: Callable[[], Any], calls: int) -> float:
        """Seconds the first `calls` launches take (warm-up and capture, compile in mode "compile")."""
        start = time.perf_counter()
        for _ in range(calls):
            launch()
        self.sync()
        return time.perf_counter() - start

    def profile(self, launch: Callable[[], Any], per_call: int, unit: str,
                calls: int = PROFILED_LAUNCHES) -> dict[str, Any]:
        """Where `calls` launches' time goes, per unit (update, cycle, vector step), read by torch.profiler:
        on CUDA the kernels the device ran (a CUDA graph's too) and how busy they kept it against the
        wall time; on the CPU device the ops the host ran. Names of the costliest kernels or ops."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_cuda else [])
        launch()
        self.sync()
        with profile(activities=activities) as trace:
            start = time.perf_counter()
            for _ in range(calls):
                launch()
            self.sync()
            wall_us = (time.perf_counter() - start) * 1e6
        wanted = DeviceType.CUDA if self.on_cuda else DeviceType.CPU
        # On the CPU device only the outermost ops count (an op's children are inside its time); on
        # CUDA, ranges that torch annotates on the device's timeline (an optimizer's step) are no kernels.
        events = [e for e in trace.events() if e.device_type == wanted and not getattr(e, "is_user_annotation", False)
                  and (self.on_cuda or e.cpu_parent is None)]
        units = calls * per_call
        by_name: dict[str, list[float]] = {}
        for event in events:
            by_name.setdefault(event.name, []).append(event.time_range.elapsed_us())
        busy_us = sum(sum(times) for times in by_name.values())
        top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:PROFILE_TOP]
        return {"unit": unit, "what": "CUDA kernels" if self.on_cuda else "host ops (outermost)",
                "per_unit": round(len(events) / units, 1), "busy_us_per_unit": round(busy_us / units, 2),
                "wall_us_per_unit": round(wall_us / units, 2), "busy_share": round(busy_us / wall_us, 3),
                "top": [{"name": name[:80], "per_unit": round(len(times) / units, 2),
                         "us_per_unit": round(sum(times) / units, 2)} for name, times in top]}

    def row(self, subject: str, call: Callable[[], Any], per_call: int, unit: str, *, where: str | None = None,
            sync: Callable[[], None] | None = None, energy_per: str = "",
            profile_per: tuple[int, str] | None = None, **fields: Any) -> Row:
        """One measured row; `profile_per` (units per call, unit name): trace it too under --profile."""
        rate, joules, why = self.rate(call, per_call, sync=sync, energy_per=energy_per)
        on_host = where == "host"
        return Row(subject, where or self.where, rate, unit, "measured" if on_host else self.label,
                   joules_per_million=joules, energy_note=why if energy_per and not on_host else "",
                   profile=self.profile(call, *profile_per) if profile_per and self.profiling else None, **fields)

    def not_run(self, subject: str, why: str) -> Row:
        return Row(subject, self.where, label=f"not run: {why}")


def ops_per_unit(call: Callable[[], Any], units: int) -> int:
    from rlbench_gpu.audit import HostRoundTripAudit

    with HostRoundTripAudit() as audit:
        call()
    return round(audit.kernel_ops / units)


# ---------------------------------------------------------------------------------------- figures
def dqn_updates(bench: Bench, capacity: int) -> Figure:
    torch, device = bench.torch, bench.device
    import numpy as np

    import rlbench
    from rlbench.kit.bench import cartpole_batch
    from rlbench_gpu.compute import GpuCompute
    from rlbench_gpu.envs import BatchedCartPole
    from rlbench_gpu.reference import ReferenceDQN, captured, eager
    from rlbench_gpu.replay import GpuPrioritizedReplay

    figure = Figure("dqn_updates", *TARGETS["dqn_updates"], peer="CPU peer",
                    conditions=f"replay memories of {capacity:,} items")
    registry = rlbench.get_registry()
    dqn = registry.get("algorithm", "dqn").create()
    config = dqn.Config(batch_size=128, hidden_sizes=(128, 128))
    spec = BatchedCartPole(1, device="cpu").spec
    rng = np.random.default_rng(0)
    beta = torch.full((), 0.4, dtype=torch.float64, device=device)
    for mode in dict.fromkeys((bench.capture, "eager") if bench.on_cuda else ("eager",)):
        compute = GpuCompute(device, capture=mode)
        replay = GpuPrioritizedReplay(capacity, seed=0, device=device)
        for start in range(0, capacity, 50_000):
            n = min(50_000, capacity - start)
            replay.add(cartpole_batch(rng, n), rng.exponential(1.0, n) + 1e-3)
        learner = dqn.make_learner(spec, compute, config, 0)
        learner.prepare_capture(0)
        launch = compute.capture(lambda: learner.device_updates(replay, PER_LAUNCH, beta),
                                 [replay.generator, learner.generator])
        startup = bench.startup(launch, 3)
        figure.rows.append(bench.row(f"rlbench: dqn learner, {PER_LAUNCH} updates per launch ({launch.describe()})",
                                     launch, PER_LAUNCH, "updates/s", startup_s=startup,
                                     profile_per=(PER_LAUNCH, "update"),
                                     ops_per_unit=ops_per_unit(lambda: learner.device_updates(replay, 1, beta), 1)))
    host = registry.get("replay", "prioritized").create(capacity=capacity, alpha=0.6, seed=0)
    for start in range(0, capacity, 50_000):
        n = min(50_000, capacity - start)
        host.add(cartpole_batch(rng, n), rng.exponential(1.0, n) + 1e-3)
    cpu_learner = dqn.make_learner(spec, registry.get("compute", "cpu").create(), config, 0)

    def cpu_update() -> None:
        sample = host.sample(128, 0.4)
        priorities, _ = cpu_learner.update(sample)
        host.update_priorities(sample.indices, priorities)

    figure.rows.append(bench.row("CPU peer: dqn learner on compute cpu + replay prioritized (C sum tree), 1 thread",
                                 cpu_update, 1, "updates/s", where="host", sync=lambda: None))
    figure.rows += _reference(bench, "plain torch DQN update + cumsum PER", lambda capturable: ReferenceDQN(
        capacity, 128, device, capturable=capturable).update, "updates/s", eager, captured, profile_unit="update")
    return figure


def replay_cycles(bench: Bench, capacity: int) -> Figure:
    torch, device = bench.torch, bench.device
    import numpy as np

    import rlbench
    from rlbench.kit.bench import cartpole_batch
    from rlbench_gpu.compute import GpuCompute
    from rlbench_gpu.reference import ReferencePER, captured, eager
    from rlbench_gpu.replay import GpuPrioritizedReplay

    figure = Figure("replay_cycles", *TARGETS["replay_cycles"], peer="CPU peer",
                    conditions=f"memories of {capacity:,} items")
    rng = np.random.default_rng(1)
    replay = GpuPrioritizedReplay(capacity, seed=0, device=device)
    host = rlbench.get_registry().get("replay", "prioritized").create(capacity=capacity, alpha=0.6, seed=0)
    for memory in (replay, host):
        for start in range(0, capacity, 50_000):
            n = min(50_000, capacity - start)
            memory.add(cartpole_batch(rng, n), rng.exponential(1.0, n) + 1e-3)
    beta = torch.full((), 0.4, dtype=torch.float64, device=device)

    def captured_cycles() -> None:
        for _ in range(PER_LAUNCH):
            replay_cycle(replay, beta)

    compute = GpuCompute(device, capture=bench.capture)
    launch = compute.capture(captured_cycles, [replay.generator])
    startup = bench.startup(launch, 3)
    figure.rows.append(bench.row(f"rlbench: replay gpu draw + set_priorities, {PER_LAUNCH} per launch "
                                 f"({launch.describe()})", launch, PER_LAUNCH, "cycles/s", startup_s=startup,
                                 profile_per=(PER_LAUNCH, "cycle"),
                                 ops_per_unit=replay_cycle_ops(replay, beta)))
    device_priorities = torch.rand(256, device=device) + 1e-3

    def loop_calls() -> None:  # what the local loop calls: sample, then update_priorities (one sync each)
        sample = replay.sample(256, 0.4)
        replay.update_priorities(sample.indices, device_priorities)

    figure.rows.append(bench.row("rlbench: replay gpu sample + update_priorities as the local loop calls them",
                                 loop_calls, 1, "cycles/s"))
    host_priorities = rng.random(256).astype(np.float32) + 1e-3

    def host_cycle() -> None:
        sample = host.sample(256, 0.4)
        host.update_priorities(sample.indices, host_priorities)

    figure.rows.append(bench.row("CPU peer: replay prioritized (C sum tree), 1 thread", host_cycle, 1, "cycles/s",
                                 where="host", sync=lambda: None))
    figure.rows += _reference(bench, "plain torch cumsum + searchsorted PER",
                              lambda capturable: ReferencePER(capacity, 256, device).cycle, "cycles/s", eager, captured,
                              profile_unit="cycle")
    return figure


def replay_cycle(replay: Any, beta: Any) -> None:
    """One cycle of the replay figure, as the captured learner step makes it: draw 256, then set their
    priorities (the weights stand in for the new |TD errors|)."""
    sample = replay.draw(256, beta)
    replay.set_priorities(sample.indices, sample.weights + 0.01)


def replay_cycle_ops(replay: Any, beta: Any) -> int:
    """Computing ops of one replay_cycle, its draw counted once. (The count was once the cycle's plus
    a draw's on its own, the draw twice: 118 where a cycle is 79 on CUDA.)"""
    return ops_per_unit(lambda: replay_cycle(replay, beta), 1)


def env_steps(bench: Bench, num_envs: int) -> Figure:
    torch, device = bench.torch, bench.device
    import rlbench
    from rlbench_gpu.compute import GpuCompute
    from rlbench_gpu.envs import BatchedCartPole
    from rlbench_gpu.reference import ReferenceCartPole, captured, eager
    from rlbench_gpu.replay import GpuPrioritizedReplay

    figure = Figure("env_steps", *TARGETS["env_steps"], peer="CPU peer", conditions=f"{num_envs:,} envs")
    registry = rlbench.get_registry()
    dqn = registry.get("algorithm", "dqn").create()
    config = dqn.Config()
    compute = GpuCompute(device, capture=bench.capture)
    env = BatchedCartPole(num_envs, seed=0, device=device, output="torch")
    replay = GpuPrioritizedReplay(max(1 << 20, 4 * ENV_STEPS_PER_LAUNCH * num_envs), seed=0, device=device)
    learner = dqn.make_learner(env.spec, compute, config, 0)
    learner.prepare_capture(0)
    env.reset(seed=0)
    env_step = torch.full((), 2 * config.exploration_steps, dtype=torch.int64, device=device)  # epsilon at its end

    def record(obs, actions, rewards, final_obs, terminated, truncated) -> None:
        replay.write({"obs": obs, "action": actions, "reward": rewards, "next_obs": final_obs,
                      "done": terminated.to(torch.float32)})

    def chunk(steps: int) -> None:
        env.rollout(steps, lambda obs: learner.explore(obs, env_step), record)

    launch = compute.capture(lambda: chunk(ENV_STEPS_PER_LAUNCH), [env.generator, replay.generator, learner.generator])
    startup = bench.startup(launch, 3)
    figure.rows.append(bench.row(f"rlbench: the one-device loop's env chunk, {ENV_STEPS_PER_LAUNCH} steps per launch: "
                                 f"epsilon-greedy DQN, transitions into replay gpu ({launch.describe()})", launch,
                                 ENV_STEPS_PER_LAUNCH * num_envs, "env steps/s", startup_s=startup,
                                 profile_per=(ENV_STEPS_PER_LAUNCH, f"vector step of {num_envs}"),
                                 energy_per="env step", ops_per_unit=ops_per_unit(lambda: chunk(1), 1),
                                 extra={"state_dtype": "float64 (gymnasium's)"}))

    import gymnasium

    vector = gymnasium.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")
    observations = [vector.reset(seed=0)[0]]
    actor = dqn.make_actor(env.spec, registry.get("compute", "cpu").create(), config, 0)
    actor.load_weights(learner.weights(), 0)

    def host_step() -> None:
        observations[0] = vector.step(actor.act(observations[0], 2 * config.exploration_steps))[0]

    figure.rows.append(bench.row("CPU peer: gymnasium CartPoleVectorEnv (numpy) + dqn actor on compute cpu, 1 thread",
                                 host_step, num_envs, "env steps/s", where="host", sync=lambda: None))
    vector.close()
    figure.rows += _reference(bench, "plain torch CartPole + MLP argmax",
                              lambda capturable: ReferenceCartPole(num_envs, device).step, "env steps/s", eager,
                              captured, per_call=num_envs, repeats=ENV_STEPS_PER_LAUNCH, energy_per="env step",
                              profile_unit=f"vector step of {num_envs}")
    return figure


def _reference(bench: Bench, what: str, make: Callable[[bool], Callable[[], None]], unit: str, eager: Callable,
               captured: Callable, *, per_call: int = 1, repeats: int = PER_LAUNCH, energy_per: str = "",
               profile_unit: str) -> list[Row]:
    rows = [bench.row(f"reference: {what}, eager", eager(make(False), 1), per_call, unit, energy_per=energy_per,
                      ops_per_unit=ops_per_unit(make(False), 1))]
    if bench.on_cuda:
        start = time.perf_counter()
        launch = captured(make(True), repeats, bench.device)
        bench.sync()
        rows.append(bench.row(f"reference: {what}, {repeats} per CUDA graph", launch, per_call * repeats, unit,
                              energy_per=energy_per, startup_s=time.perf_counter() - start,
                              profile_per=(repeats, profile_unit)))
    else:
        rows.append(bench.not_run(f"reference: {what}, {repeats} per CUDA graph", "CUDA graphs need CUDA"))
    return rows


def end_to_end(bench: Bench, algo: str, steps: int | None, num_envs: int, eval_episodes: int) -> Figure:
    """One rlbench.run per side, same hyperparameters and budget: gpu env + replay + compute (the
    one-device loop) beside the core's gymnasium env + prioritized + cpu."""
    import rlbench

    key = f"{algo}_e2e"
    figure = Figure(key, *TARGETS[key], peer="CPU peer",
                    conditions=f"{steps:,} env steps per side" if steps else "the algorithm's own budget, 10 greedy episodes")
    env = "CartPole-v1" if algo == "dqn" else "Pendulum-v1"
    same = dict(algo=algo, num_envs=num_envs, steps=steps, eval_episodes=eval_episodes, seed=0, out=None)
    sides = [("CPU peer: rlbench run, gymnasium env + prioritized + cpu (the local loop)",
              rlbench.RunConfig(env=env, replay="prioritized", compute="cpu", **same), "host")]
    if bench.on_cuda:
        sides.insert(0, ("rlbench: rlbench run, gpu env + replay + compute (the one-device loop)",
                         rlbench.RunConfig(env=f"gpu/{env}", replay="gpu", compute="gpu",
                                           options={"compute": {"device": bench.device.index or 0,
                                                                "capture": bench.capture}}, **same), bench.where))
    else:
        figure.rows.append(bench.not_run("rlbench: rlbench run, gpu env + replay + compute (the one-device loop)",
                                         "rlbench.run builds the registered gpu components, which need CUDA (the "
                                         "loop's CPU-device runs are tests: plugins/gpu/tests/test_device_loop.py)"))
    for subject, config, where in sides:
        result = rlbench.run(config)
        throughput = result["throughput"]
        env_steps = throughput["env_steps"]
        energy = (result.get("energy") or {}).get("nvml") or {}
        joules = energy.get("joules")
        row = Row(subject, where, throughput.get("steady_env_steps_per_s") or throughput["env_steps_per_s"], "env steps/s",
                  "measured" if where == "host" else bench.label,
                  joules_per_million=joules / env_steps * 1e6 if joules and where != "host" else None,
                  energy_note="" if joules or where == "host" else energy.get("reason", bench.energy_reason),
                  extra={"loop": result["loop"].get("name"), "wall_s": round(result["timing"]["wall_s"], 2),
                         "env_steps": env_steps, "updates": throughput["updates"],
                         "greedy_return": (result.get("evaluation") or {}).get("mean_return")})
        figure.rows.append(row)
    return figure


def judge(figure: Figure, bench: Bench) -> None:
    """Compare each rlbench row with its peer, and the best rlbench row with the target (on CUDA only)."""
    peer = next((r for r in figure.rows if r.subject.startswith(figure.peer) and r.rate), None)
    for row in figure.rows:
        if peer is not None and row.rate:
            row.extra["x_peer"] = row.rate / peer.rate
    ours = [r for r in figure.rows if r.subject.startswith("rlbench") and r.rate]
    if not bench.on_cuda:
        figure.judged = "not judged: the targets are an H100's, this ran on the CPU device"
        return
    if not ours:
        figure.judged = "not judged: no rlbench figure"
        return
    best = max(ours, key=lambda r: r.rate)
    value = best.extra.get("x_peer") if figure.key.endswith("_e2e") else best.rate
    if value is None:
        figure.judged = "not judged: no CPU peer"
        return
    met = value >= figure.target
    figure.judged = f"{'met' if met else 'NOT met'}: {value:,.1f} against {figure.target:,.0f}" + (
        "" if met else f" (x{figure.target / value:.1f} short; where the time goes: --profile)")
    greedy = best.extra.get("greedy_return")
    if figure.key in RETURN_TARGETS and greedy is not None:
        least, within_s = RETURN_TARGETS[figure.key]
        learnt = greedy >= least and (within_s is None or best.extra["wall_s"] <= within_s)
        figure.judged += (f"; greedy return {greedy:,.1f} in {best.extra['wall_s']:.1f} s: "
                          f"{'met' if learnt else 'NOT met'} (at least {least:,.0f}"
                          + (f" within {within_s:.0f} s)" if within_s else ")"))


def failed_figure(key: str, error: Exception, bench: Bench) -> Figure:
    """The figure `key` that raised `error`: one row saying so, where the figure's rows would be."""
    import traceback

    title, target = TARGETS.get(key, (key, None))
    frames = traceback.extract_tb(error.__traceback__)
    at = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    message = f"{type(error).__name__}: {error}".strip().splitlines()[0] + at
    return Figure(key, title, target, rows=[Row(f"{key}: failed, not measured", bench.where, label=f"failed: {message}")],
                  judged=f"failed: {message}", error=message)


def measured_figure(key: str, make: Callable[[], Figure], bench: Bench) -> Figure:
    """make() judged, or, where it raises, a failed figure: one figure's failure costs the run no other."""
    try:
        figure = make()
        if not figure.judged:  # a figure with no target (cnn_update) gives its own verdict
            judge(figure, bench)
        return figure
    except Exception as error:  # noqa: BLE001 - any failure of a figure is that figure's row; Ctrl-C still stops
        return failed_figure(key, error, bench)


def run_suite(device: Any, *, seconds: float, capture: str, label: str, num_envs: int, capacity: int,
              dqn_capacity: int, e2e_steps: int | None, e2e_num_envs: int, eval_episodes: int,
              figures: tuple[str, ...], profiling: bool = False,
              more: dict[str, Callable[[Bench], Figure]] | None = None,
              on_start: Callable[[dict[str, Any]], None] | None = None,
              on_figure: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The figures in the order named, each kept (and handed to on_figure) as it completes, a failed
    one as a row with its error; `more`: figures measured by the caller (bench.py's cnn_update);
    on_start gets the report's header before the first figure; "failed" lists the failed figures' keys."""
    bench = Bench(device, seconds, capture, label, profiling)
    makers: dict[str, Callable[[], Figure]] = {
        "dqn_updates": lambda: dqn_updates(bench, dqn_capacity),
        "replay_cycles": lambda: replay_cycles(bench, capacity),
        "env_steps": lambda: env_steps(bench, num_envs),
        "dqn_e2e": lambda: end_to_end(bench, "dqn", e2e_steps, e2e_num_envs, eval_episodes),
        "ddpg_e2e": lambda: end_to_end(bench, "ddpg", e2e_steps, e2e_num_envs, eval_episodes)}
    for key, make in (more or {}).items():
        makers[key] = (lambda make: lambda: make(bench))(make)
    report: dict[str, Any] = {
        "device": label, "measured_on": str(device), "capture": capture, "updates_per_launch": PER_LAUNCH,
        "env_steps_per_launch": ENV_STEPS_PER_LAUNCH, "rounds": ROUNDS, "seconds_per_subject": seconds,
        "energy": bench.energy_reason or "NVML", "figures": [], "failed": []}
    if on_start is not None:
        on_start(report)
    for key in figures:
        figure = asdict(measured_figure(key, makers[key], bench))
        report["figures"].append(figure)
        if figure["error"]:
            report["failed"].append(key)
        if on_figure is not None:
            on_figure(figure)
    return report
