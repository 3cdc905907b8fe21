"""Benchmarks of the gpu components beside their CPU peers, measured in the same run.

- `rlbench bench env`: env steps/s with random actions of gpu/CartPole-v1 and gpu/Pendulum-v1
  (eager, float32, and CUDA-graph replay on CUDA) beside gymnasium's numpy-vectorised CartPole and
  the core's gymnasium envs, ratios to the core's env.
- `rlbench gpu replay`: the learner's replay cycle, sample(batch) + update_priorities(batch), of
  replay gpu beside the core's `prioritized` on the host, at capacity 1,000,000 by default.
- `rlbench gpu dqn`: DQN end to end through `rlbench.run`, gpu env + gpu replay + gpu compute beside
  gymnasium env + prioritized + cpu compute, same hyperparameters and budget.
- `rlbench gpu bench`: issue #22's target figures in one run, each beside its CPU peer and
  plain-torch references, eager and captured (suite.py says what each row measures).

`bench env` and `gpu replay` take --device: "cuda" when torch sees a GPU, else "cpu", which runs the
gpu plugin's code on the host and labels every figure so (useful for CI, not a GPU figure). `gpu dqn`
runs the registered components, which need CUDA. Torch and numpy's BLAS are pinned to one thread
so the CPU peers are single-threaded. CUDA timings end with a synchronize. Only click is imported
at module level.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable

import click

ROUNDS = 5
_FIGURES = ("dqn_updates", "replay_cycles", "env_steps", "dqn_e2e", "ddpg_e2e")  # suite.TARGETS' keys (no torch here)
GPU_SIDE = "gpu env + gpu replay + gpu compute"
CPU_SIDE = "gymnasium env + prioritized + cpu compute"


def _device_option(function: Callable) -> Callable:
    return click.option("--device", default=None, metavar="DEVICE",
                        help="cuda, cuda:N or cpu [default: cuda when available, else cpu]")(function)


def _setup(device: str | None) -> tuple[Any, dict[str, Any], str]:
    """(torch device, pinned threads, label) for the subject under test."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from rlbench.kit.bench import pin_one_thread
    from rlbench_gpu.device import resolve_device

    pinned = pin_one_thread()
    resolved = resolve_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if resolved.type == "cuda":
        label = f"{resolved} {torch.cuda.get_device_name(resolved)}"
    else:
        from rlbench_gpu.device import probe_cuda

        why = probe_cuda().reason or "cpu device chosen"
        label = f"cpu device: the gpu plugin's code run on the host, NOT a GPU figure ({why})"
    return resolved, pinned, label


def _steps_per_second(step: Callable[[], Any], sync: Callable[[], None], seconds: float, items: int) -> float:
    """Median over ROUNDS of items stepped per second; each round ends with `sync` (CUDA queue drained)."""
    step()
    sync()
    rates = []
    for _ in range(ROUNDS):
        calls = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds / ROUNDS:
            for _ in range(8):
                step()
            calls += 8
        sync()
        rates.append(calls * items / (time.perf_counter() - start))
    return statistics.median(rates)


# ------------------------------------------------------------------------------------------------ env
def measure_environments(device: Any, num_envs: int, seconds: float) -> list[dict[str, Any]]:
    import numpy as np
    import torch

    import rlbench
    from rlbench_gpu.device import synchronize
    from rlbench_gpu.envs import BatchedCartPole, BatchedPendulum

    rows: list[dict[str, Any]] = []
    sync = lambda: synchronize(device)  # noqa: E731
    variants = [("float64", False), ("float32", False)] + ([("float32", True)] if device.type == "cuda" else [])
    for env_class, discrete in ((BatchedCartPole, True), (BatchedPendulum, False)):
        for dtype, graph in variants:
            env = env_class(num_envs, seed=0, device=device, dtype=dtype, output="torch", graph=graph)
            env.reset()
            generator = torch.Generator(device=device).manual_seed(1)
            if discrete:
                actions = lambda: torch.randint(0, 2, (num_envs,), generator=generator, device=device)  # noqa: E731
            else:
                actions = lambda: torch.rand((num_envs, 1), generator=generator, device=device) * 4 - 2  # noqa: E731
            rate = _steps_per_second(lambda: env.step(actions()), sync, seconds, num_envs)
            rows.append({"env": env.spec.id, "variant": f"{dtype}" + (" cuda-graph" if graph else " eager"),
                         "where": str(device), "env_steps_per_s": rate})
            env.close()

    rng = np.random.default_rng(0)
    import gymnasium

    vector = gymnasium.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")
    vector.reset(seed=0)
    rows.append({"env": "CartPole-v1", "variant": "gymnasium CartPoleVectorEnv (numpy)", "where": "host",
                 "env_steps_per_s": _steps_per_second(lambda: vector.step(rng.integers(0, 2, num_envs)), lambda: None,
                                                      seconds, num_envs)})
    vector.close()
    for env_id, discrete in (("CartPole-v1", True), ("Pendulum-v1", False)):
        core = rlbench.get_registry().get("environment", env_id).create(num_envs=num_envs, seed=0)
        core.reset()
        if discrete:
            step = lambda: core.step(rng.integers(0, 2, num_envs))  # noqa: E731
        else:
            step = lambda: core.step(rng.uniform(-2, 2, (num_envs, 1)).astype(np.float32))  # noqa: E731
        rows.append({"env": env_id, "variant": "core GymnasiumEnv (reference)", "where": "host",
                     "env_steps_per_s": _steps_per_second(step, lambda: None, seconds, num_envs)})
        core.close()
    for row in rows:
        reference = next(r for r in rows if r["env"].split("/")[-1] == row["env"].split("/")[-1]
                         and r["variant"].startswith("core"))
        row["x_core"] = row["env_steps_per_s"] / reference["env_steps_per_s"]
    return rows


@click.command("env")
@click.option("--num-envs", type=click.IntRange(min=1), default=4096, show_default=True)
@click.option("--seconds", type=click.FloatRange(min=0.05), default=2.0, show_default=True,
              help="Measuring time per subject (split over 5 rounds; the median round is reported).")
@_device_option
@click.option("--json", "as_json", is_flag=True)
def env_command(num_envs: int, seconds: float, device: str | None, as_json: bool) -> None:
    """Env steps/s with random actions: gpu/ batched envs beside gymnasium's and the core's."""
    resolved, pinned, label = _setup(device)
    rows = measure_environments(resolved, num_envs, seconds)
    report = {"device": label, "num_envs": num_envs, "threads": pinned, "results": rows}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"# {num_envs} environments, random actions; gpu/ envs on {label}")
    click.echo(f"# threads: {pinned}; median of {ROUNDS} rounds; xN = rate / the core GymnasiumEnv's rate")
    click.echo(f"{'env':<17} {'variant':<38} {'where':<7} {'env steps/s':>14} {'x core':>9}")
    for row in rows:
        click.echo(f"{row['env']:<17} {row['variant']:<38} {row['where']:<7} {row['env_steps_per_s']:>14,.0f} "
                   f"{row['x_core']:>8.1f}x")


# --------------------------------------------------------------------------------------------- replay
def measure_replay(device: Any, capacity: int, batch_size: int, seconds: float) -> dict[str, Any]:
    import numpy as np
    import torch

    import rlbench
    from rlbench.kit.bench import cartpole_batch
    from rlbench_gpu.device import synchronize
    from rlbench_gpu.replay import GpuPrioritizedReplay

    rng = np.random.default_rng(0)
    core = rlbench.get_registry().get("replay", "prioritized")
    memories = {"gpu": GpuPrioritizedReplay(capacity, alpha=0.6, seed=0, device=device),
                "prioritized (core, host)": core.create(capacity=capacity, alpha=0.6, seed=0)}
    fill = {}
    for name, memory in memories.items():
        start = time.perf_counter()
        for begin in range(0, capacity, 50_000):
            n = min(50_000, capacity - begin)
            memory.add(cartpole_batch(rng, n), rng.exponential(1.0, n) + 1e-3)
        synchronize(device)
        fill[name] = time.perf_counter() - start
    # New priorities as the learner makes them: device tensors for the device memory, numpy for the host one.
    device_priorities = [torch.rand(batch_size, dtype=torch.float32, device=device) + 1e-3 for _ in range(64)]
    host_priorities = [rng.random(batch_size).astype(np.float32) + 1e-3 for _ in range(64)]
    counter = [0]

    def cycle(memory: Any, priorities: list) -> Callable[[], None]:
        def run() -> None:
            sample = memory.sample(batch_size, 0.4)
            memory.update_priorities(sample.indices, priorities[counter[0] % 64])
            counter[0] += 1
        return run

    rates = {"gpu": _steps_per_second(cycle(memories["gpu"], device_priorities), lambda: synchronize(device),
                                      seconds, 1),
             "prioritized (core, host)": _steps_per_second(cycle(memories["prioritized (core, host)"], host_priorities),
                                                           lambda: None, seconds, 1)}
    return {"rates": rates, "fill_seconds": fill, "ratio": rates["gpu"] / rates["prioritized (core, host)"],
            "tree": memories["gpu"].stats()["tree"]}


# ----------------------------------------------------------------------------------------------- dqn
def measure_dqn(device: Any, num_envs: int, steps: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """One DQN run per side through rlbench.run (placement local: the core's loop), same
    hyperparameters and budget, no evaluation; each side's steady env steps/s (start-up excluded)
    where the result has it, else over the whole run."""
    import rlbench

    same = dict(num_envs=num_envs, steps=steps, eval_episodes=0, out=None, hyperparameters=dict(overrides))
    configs = {GPU_SIDE: rlbench.RunConfig(env="gpu/CartPole-v1", replay="gpu", compute="gpu",
                                           options={"compute": {"device": device.index}}, **same),
               CPU_SIDE: rlbench.RunConfig(env="CartPole-v1", replay="prioritized", compute="cpu", **same)}
    results = {}
    for name, config in configs.items():
        result = rlbench.run(config)
        throughput = result["throughput"]
        steady = throughput.get("steady_env_steps_per_s")
        results[name] = {"env_steps": throughput["env_steps"], "updates": throughput["updates"],
                         "wall_s": result["timing"]["wall_s"], "env_steps_per_s": steady or throughput["env_steps_per_s"],
                         "rate": "steady" if steady else "whole run", "updates_per_s": throughput["updates_per_s"]}
    return {"results": results, "ratio": results[GPU_SIDE]["env_steps_per_s"] / results[CPU_SIDE]["env_steps_per_s"]}


def _hp_value(text: str) -> Any:
    """A --hp value as a run file writes it (TOML: 64, 3e-4, true, [64, 64]; 64,64 too); a bare word
    stays a string."""
    import tomllib

    for candidate in (text, f"[{text}]"):
        try:
            return tomllib.loads(f"value = {candidate}")["value"]
        except tomllib.TOMLDecodeError:
            pass
    return text


@click.group("gpu")
def gpu() -> None:
    """The gpu plugin: device report and benchmarks beside CPU peers."""


@gpu.command("info")
def info_command() -> None:
    """Whether CUDA is usable here, and what the devices are."""
    from rlbench_gpu.capabilities import probe
    from rlbench_gpu.fingerprint import gpu_fingerprint

    found = probe()
    click.echo(json.dumps({"available": found.available, "reason": found.reason,
                           "fingerprint": gpu_fingerprint()}, indent=2))


@gpu.command("replay")
@click.option("--capacity", type=click.IntRange(min=1000), default=1_000_000, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--seconds", type=click.FloatRange(min=0.05), default=2.0, show_default=True)
@_device_option
@click.option("--json", "as_json", is_flag=True)
def replay_command(capacity: int, batch_size: int, seconds: float, device: str | None, as_json: bool) -> None:
    """sample(batch) + update_priorities(batch) cycles/s: replay gpu beside the core's prioritized."""
    resolved, pinned, label = _setup(device)
    report = {"device": label, "capacity": capacity, "batch_size": batch_size, "threads": pinned,
              **measure_replay(resolved, capacity, batch_size, seconds)}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"# learner cycle sample({batch_size}) + update_priorities({batch_size}), memories filled to "
               f"{capacity:,}; replay gpu on {label} ({report['tree']})")
    click.echo(f"# threads: {pinned}; median of {ROUNDS} rounds")
    for name, rate in report["rates"].items():
        click.echo(f"{name:<26} {rate:>12,.0f} cycles/s   fill {report['fill_seconds'][name]:.2f} s")
    click.echo(f"gpu / prioritized: x{report['ratio']:.2f}")


@gpu.command("dqn")
@click.option("--num-envs", type=click.IntRange(min=1), default=4096, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=400_000, show_default=True, help="Env steps per side.")
@click.option("--hp", multiple=True, metavar="KEY=VALUE",
              help="DQN hyperparameter override, both sides [default: train_every=64 learning_starts=20000 "
                   "buffer_size=200000]")
@click.option("--device", default="cuda", show_default=True, metavar="DEVICE",
              help="cuda or cuda:N: the gpu side runs the registered gpu components, which need CUDA")
@click.option("--json", "as_json", is_flag=True)
def dqn_command(num_envs: int, steps: int, hp: tuple[str, ...], device: str, as_json: bool) -> None:
    """DQN end to end, env steps/s: gpu env + replay + compute beside gymnasium + prioritized + cpu."""
    overrides: dict[str, Any] = {"train_every": 64, "learning_starts": 20_000, "buffer_size": 200_000}
    for item in hp:
        key, sep, raw = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--hp")
        overrides[key.strip()] = _hp_value(raw.strip())
    resolved, pinned, label = _setup(device)
    if resolved.type != "cuda":
        from rlbench_gpu.device import GpuError

        raise GpuError(f"gpu dqn runs the registered gpu components (rlbench.run), which run on CUDA only; "
                       f"--device {device} is for `rlbench gpu replay` and `rlbench bench env`")
    report = {"device": label, "num_envs": num_envs, "steps": steps, "hyperparameters": overrides,
              "threads": pinned, **measure_dqn(resolved, num_envs, steps, overrides)}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"# DQN CartPole, {num_envs} envs, {steps:,} env steps per side, hp {overrides}; gpu side on {label}")
    click.echo(f"# threads: {pinned}; rlbench.run, placement local (the core's loop), no evaluation")
    for name, row in report["results"].items():
        click.echo(f"{name:<44} {row['env_steps_per_s']:>12,.0f} env steps/s ({row['rate']})  "
                   f"{row['updates_per_s']:>9,.0f} updates/s  {row['wall_s']:.1f} s")
    click.echo(f"gpu / cpu env steps/s: x{report['ratio']:.2f}")


def _format_profile(profile: dict[str, Any]) -> str:
    top = ", ".join(f"{k['name']} {k['per_unit']:g}x {k['us_per_unit']:,.1f} us" for k in profile["top"])
    return (f"        profile per {profile['unit']}: {profile['per_unit']:g} {profile['what']}, "
            f"busy {profile['busy_us_per_unit']:,.1f} us of {profile['wall_us_per_unit']:,.1f} us wall "
            f"({profile['busy_share']:.0%}); costliest: {top}")


@gpu.command("bench")
@click.option("--seconds", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Measuring time per subject (split over 5 rounds; the median round is reported).")
@click.option("--num-envs", type=click.IntRange(min=1), default=4096, show_default=True, help="Envs of the env figure.")
@click.option("--capacity", type=click.IntRange(min=1000), default=1_000_000, show_default=True,
              help="Items in the memories of the replay figure.")
@click.option("--dqn-capacity", type=click.IntRange(min=1000), default=200_000, show_default=True,
              help="Items in the memories of the DQN update figure.")
@click.option("--e2e-steps", type=click.IntRange(min=1), default=3000, show_default=True,
              help="Env steps per side of the end-to-end runs (--full: the algorithms' own budgets).")
@click.option("--e2e-num-envs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--full", is_flag=True,
              help="End-to-end runs at the algorithms' own budgets, with 10 greedy evaluation episodes each.")
@click.option("--figure", "figures", multiple=True, type=click.Choice(list(_FIGURES)),
              help="Only these figures [default: all].")
@click.option("--capture", type=click.Choice(["graph", "compile", "eager"]), default="graph", show_default=True,
              help="How rlbench's captured subjects launch (the compute option --gpu-capture).")
@click.option("--profile", "profiling", is_flag=True,
              help="Also trace each captured subject with torch.profiler: kernels per unit, the device's busy time "
                   "against the wall time, the costliest kernels (host ops on the CPU device).")
@_device_option
@click.option("--json", "as_json", is_flag=True)
def bench_command(seconds: float, num_envs: int, capacity: int, dqn_capacity: int, e2e_steps: int, e2e_num_envs: int,
                  full: bool, figures: tuple[str, ...], capture: str, profiling: bool, device: str | None,
                  as_json: bool) -> None:
    """Issue #22's figures: each beside its CPU peer and plain-torch references, in one run."""
    resolved, pinned, label = _setup(device)
    from rlbench_gpu.suite import run_suite

    report = {"threads": pinned, **run_suite(resolved, seconds=seconds, capture=capture, label=label,
                                             num_envs=num_envs, capacity=capacity, dqn_capacity=dqn_capacity,
                                             e2e_steps=None if full else e2e_steps, e2e_num_envs=e2e_num_envs,
                                             eval_episodes=10 if full else 0, figures=figures or tuple(_FIGURES),
                                             profiling=profiling)}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    import torch

    click.echo("# rlbench gpu bench: each figure beside its CPU peer and plain-torch references, measured in this run")
    click.echo(f"# device: {label}")
    click.echo(f"# torch {torch.__version__}; threads: {pinned}; rlbench launches: K={report['updates_per_launch']} "
               f"updates, S={report['env_steps_per_launch']} env steps, capture {capture}; median of "
               f"{report['rounds']} rounds of {seconds / report['rounds']:.2f} s")
    click.echo(f"# energy: {report['energy']}")
    click.echo("# x peer: rate / the CPU peer's rate; ops: computing aten ops per unit (~ kernel launches on CUDA); "
               "start: warm-up + capture s")
    for figure in report["figures"]:
        click.echo("")
        click.echo(f"{figure['title']}  (this run: {figure['conditions']})")
        click.echo(f"  target on an H100: {figure['target']:,.0f}; {figure['judged']}")
        for row in figure["rows"]:
            rate = f"{row['rate']:>15,.0f} {row['unit']:<11}" if row["rate"] is not None else f"{'-':>15} {'':<11}"
            ratio = row["extra"].get("x_peer")
            energy = (f"{row['joules_per_million']:,.1f} J/1M" if row["joules_per_million"] is not None else
                      (f"energy: {row['energy_note']}" if row["energy_note"] else ""))
            details = [f"x{ratio:.2f} peer" if ratio is not None else "",
                       f"{row['ops_per_unit']} ops" if row["ops_per_unit"] is not None else "",
                       f"start {row['startup_s']:.2f} s" if row["startup_s"] is not None else "",
                       ", ".join(f"{k} {v}" for k, v in row["extra"].items() if k not in ("x_peer",)
                                 and v is not None), energy]
            click.echo(f"  {row['subject']}")
            click.echo(f"      {row['where']:<7} {rate} {'; '.join(d for d in details if d)}  [{row['label']}]")
            if row["profile"]:
                click.echo(_format_profile(row["profile"]))
