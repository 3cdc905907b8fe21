"""`rlbench upmem ...` commands (added to the rlbench CLI by the plugin's rlbench_register_commands)."""

from __future__ import annotations

from pathlib import Path

import click

from rlbench.errors import RlbenchError
from rlbench_upmem.hardware import MAX_DPUS, dpu_count

ROUNDS, SECONDS_PER_ROUND = 5, 0.25  # `upmem bench`: about 2.5 s of interleaved timing


class DpuCount(click.ParamType):
    """--dpus: hardware.dpu_count's one-line refusal as a usage error (exit 2)."""

    name = "dpus"

    def convert(self, value, param, ctx):
        try:
            return dpu_count(value)
        except RlbenchError as exc:
            self.fail(str(exc), param, ctx)


def _dpu_list(_ctx: click.Context, _param: click.Parameter, text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        raise click.BadParameter(f"expected comma-separated integers like 64,128,256, got {text!r}")
    try:
        return [dpu_count(part) for part in parts]
    except RlbenchError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group()
def upmem() -> None:
    """UPMEM processing-in-memory: emulated DPUs, modelled hardware time."""


_WORKLOAD = [
    click.option("--env", "env_id", default="Taxi-v3", show_default=True, help="toy-text environment of the dataset"),
    click.option("--dataset", "size", type=int, default=1_000_000, show_default=True, help="transitions"),
    click.option("--behaviour", type=click.Choice(["random", "epsilon-greedy"]), default="random", show_default=True),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--numeric", type=click.Choice(["fp32", "int32"]), default="fp32", show_default=True),
]


def _workload(fn):
    for option in reversed(_WORKLOAD):
        fn = option(fn)
    return fn


@upmem.command()
@click.option("--algo", type=click.Choice(["qlearning", "sarsa"]), default="qlearning", show_default=True)
@_workload
@click.option("--dpus", "dpus_list", default="64,128,256,512,1024,2048", show_default=True, callback=_dpu_list,
              help=f"comma-separated DPU counts, each at most {MAX_DPUS:,}")
@click.option("--epochs", type=int, default=10, show_default=True)
@click.option("--alpha", type=float, default=0.1, show_default=True)
@click.option("--gamma", type=float, default=0.99, show_default=True)
@click.option("--partition", type=click.Choice(["contiguous", "stride", "random"]), default="contiguous",
              show_default=True)
@click.option("--tasklets", type=int, default=16, show_default=True)
@click.option("--fixed-point-scale", "scale", type=int, default=1 << 16, show_default=True)
@click.option("--sync-every", type=int, default=1, show_default=True, help="epochs between host aggregations")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output folder [default: upmem-scale-<env>-<algo>]")
def scale(algo, env_id, size, behaviour, seed, numeric, dpus_list, epochs, alpha, gamma, partition, tasklets, scale,
          sync_every, out):
    """Strong scaling over DPU counts: emulator and CPU times [measured], UPMEM times and efficiency [modelled]."""
    from rlbench_upmem.scale import ascii_chart, format_table, run_scale, write_outputs

    try:
        result = run_scale(algo=algo, env_id=env_id, dpus_list=dpus_list, size=size, behaviour=behaviour,
                           seed=seed, epochs=epochs, alpha=alpha, gamma=gamma, numeric=numeric, partition=partition,
                           tasklets=tasklets, scale=scale, sync_every=sync_every)
    except RlbenchError as exc:
        raise click.ClickException(str(exc))
    click.echo(format_table(result))
    written = write_outputs(result, out or Path(f"upmem-scale-{env_id}-{algo}"))
    if not any(p.suffix == ".png" for p in written):
        click.echo("\n" + ascii_chart(result))
        click.echo("(matplotlib is not installed, so no PNG: pip install 'rlbench-upmem[plot]')")
    click.echo("wrote " + ", ".join(str(p) for p in written))


@upmem.command()
@_workload
@click.option("--dpus", type=DpuCount(), default=1024, show_default=True, help=f"at most {MAX_DPUS:,}")
@click.option("--epochs", type=int, default=5, show_default=True)
@click.option("--algo", "rule", type=click.Choice(["qlearning", "sarsa"]), default="qlearning", show_default=True)
@click.option("--python-updates", type=int, default=1_000_000, show_default=True,
              help="updates the plain Python loop runs (its rate is per update)")
@click.option("--rounds", type=click.IntRange(min=1), default=ROUNDS, show_default=True,
              help="rounds in which the emulator and numba take turns (medians are compared)")
@click.option("--seconds", type=click.FloatRange(min=0.001), default=SECONDS_PER_ROUND, show_default=True,
              help="measuring time of each in a round")
def bench(env_id, size, behaviour, seed, numeric, dpus, epochs, rule, python_updates, rounds, seconds):
    """Emulator updates/s beside a numba single-table loop, a numpy lock-step and plain Python; its memory."""
    from rlbench_upmem.bench import format_bench, run_bench

    try:
        result = run_bench(env_id=env_id, size=size, behaviour=behaviour, seed=seed, dpus=dpus, epochs=epochs,
                           rule=rule, numeric=numeric, python_updates=python_updates, rounds=rounds, seconds=seconds)
    except RlbenchError as exc:
        raise click.ClickException(str(exc))
    click.echo(format_bench(result))


if __name__ == "__main__":
    upmem()
