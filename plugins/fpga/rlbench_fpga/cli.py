"""`rlbench fpga devices` and `rlbench fpga bench`. Only click at import: `rlbench --help` stays fast."""

from __future__ import annotations

import json
import os
from typing import Any

import click

ONE_THREAD = {"POCL_MAX_PTHREAD_COUNT": "1", "OMP_NUM_THREADS": "1"}


@click.group("fpga")
def fpga() -> None:
    """OpenCL FPGA kernels (PEARL): devices, and benchmarks beside their CPU peers."""


@fpga.command("devices")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def devices_command(as_json: bool) -> None:
    """OpenCL platforms and devices, which one the kernels use and why, or what to install."""
    from rlbench_fpga import device, icd

    rows = [device.describe(d).as_dict() for d in device.all_devices()]
    try:
        chosen, why = device.choose()
        choice: dict[str, Any] = {"device": device.describe(chosen).as_dict(), "why": why}
    except device.OpenclDeviceError as error:
        choice = {"device": None, "why": str(error)}
    report = {"devices": rows, "chosen": choice, "emulator_library": icd.emulator_library(),
              "OCL_ICD_VENDORS": os.environ.get("OCL_ICD_VENDORS")}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if not rows:
        click.echo("no OpenCL devices found")
    for row in rows:
        mode = f"emulation: {row['emulation_kind']}" if row["emulation"] else "hardware"
        channels = ", intel channels" if row["channels"] else ""
        click.echo(f"- {row['platform']} / {row['device']} [{row['type']}] ({mode}{channels})")
    chosen_row = choice["device"]
    click.echo(f"chosen: {chosen_row['device'] + ' on ' + chosen_row['platform'] if chosen_row else 'none'}: {choice['why']}")
    if report["emulator_library"] is None:
        click.echo("Intel FPGA emulator: not installed (optional; see plugins/fpga/README.md)")


@fpga.command("bench")
@click.option("--capacity", type=click.IntRange(min=1000), default=1_000_000, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True,
              help="Interleaved rounds; the median round is reported.")
@click.option("--seconds", type=click.FloatRange(min=0.01), default=0.5, show_default=True,
              help="Measuring time per subject and round.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def bench_command(capacity: int, batch_size: int, rounds: int, seconds: float, as_json: bool) -> None:
    """Replay sample+update round (fpga vs cpprb vs a numpy sum tree) and MLP 4-64-64-2 inference
    (fpga vs torch CPU), measured in the same run on one thread, with the modelled board latency."""
    for key, value in ONE_THREAD.items():
        os.environ.setdefault(key, value)  # before PoCL and BLAS start their threads
    from rlbench_fpga.bench import run_bench

    report = run_bench(capacity=capacity, batch_size=batch_size, rounds=rounds, seconds=seconds)
    click.echo(json.dumps(report, indent=2) if as_json else format_report(report))


def format_report(report: dict[str, Any]) -> str:
    from rlbench_fpga.bench import FLOOR

    lines = [f"device: {report['device']['device']} on {report['device']['platform']} "
             f"[{report['device']['type']}], emulation={report['device']['emulation']}",
             f"threads: {report['threads']}; median of {report['rounds']} interleaved rounds", ""]
    replay = report["replay"]
    lines.append(f"replay sample({replay['batch_size']}) + update({replay['batch_size']}) round at capacity "
                 f"{replay['capacity']:,} (measured, us per round)")
    fpga_us = replay["measured_us"]["fpga"]
    for name, result in replay["measured_us"].items():
        if name == FLOOR:
            speed = "   upload + empty kernel + download on this device: no fpga round can beat it"
        else:
            speed = "" if name == "fpga" else f"   fpga is {result / fpga_us:.2f}x as fast as {name}"
        lines.append(f"  {name:14s} {result:9.1f} us{speed}")
    modelled = replay["modelled_us"]
    lines.append(f"  modelled on {report['board']['name']}: sample {modelled['sample']:.1f} us + update "
                 f"{modelled['update']:.1f} us = {modelled['round']:.1f} us (modelled, not measured)")
    mlp = report["mlp"]
    lines += ["", f"MLP {mlp['layers']} batch {mlp['batch']} inference (measured, p50 us per call)"]
    lines.append(f"  fpga {mlp['measured_us']['fpga']:.1f} us   torch CPU {mlp['measured_us']['torch-cpu']:.1f} us   "
                 f"fpga / torch = {mlp['ratio_to_torch']:.2f}")
    lines.append(f"  modelled on the board: {mlp['modelled_us']:.1f} us (modelled, not measured)")
    return "\n".join(lines)


