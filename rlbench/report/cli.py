"""The study commands: `rlbench sweep`, `rlbench report`, `rlbench compare`, `rlbench dashboard`.
Only click is imported here; matplotlib and scipy load when a command runs."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from rlbench.errors import RlbenchError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def _default_folder(study_file: str | None, name: str) -> Path:
    """A study's own study.toml resumes into its folder; any other study goes to results/studies/NAME."""
    if study_file and Path(study_file).name == "study.toml" and (Path(study_file).parent / "runs").is_dir():
        return Path(study_file).parent
    return Path("results") / "studies" / name.replace("/", "_").replace(" ", "-")


def _seeds_option(text: str | None) -> int | list[int] | None:
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise RlbenchError(f"--seeds takes a count (5) or a list (0,1,2), got {text!r}") from None
    if not values:
        raise RlbenchError(f"--seeds takes a count (5) or a list (0,1,2), got {text!r}")
    return values if "," in text else values[0]


@click.command("sweep", context_settings=CONTEXT)
@click.argument("study_file", required=False, type=click.Path(dir_okay=False))
@click.option("--grid", multiple=True, metavar="KEY=V1,V2",
              help="An axis: a run field (replay, placement, actors, ...), hp.NAME or options.FLAG, and its values "
                   "(';' between values that are lists: hp.hidden_sizes=64,64;128,128). Repeatable.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="A setting of every cell (keys as --grid). Repeatable.")
@click.option("--seeds", default=None, help="Seeds: a count (5 = seeds 0..4) or a list (0,1,2) [default: the file's, else 5].")
@click.option("--name", default=None, help="Study name [default: the file's [sweep] name or stem].")
@click.option("--target", "target_return", type=float, default=None,
              help="Target return for time-to-target (mean of the last --target-window training episodes).")
@click.option("--target-window", type=int, default=None, help="Episodes averaged for the target [default: 10].")
@click.option("--out", default=None, help="Results folder [default: results/studies/NAME].")
@click.option("--parallel", type=int, default=1, show_default=True,
              help="Cells at once, each its own process (they then share this machine's cores: the report says so).")
@click.option("--dry-run", is_flag=True, help="List the cells and which would run, and stop.")
def sweep_command(study_file, grid, sets, seeds, name, target_return, target_window, out, parallel, dry_run):
    """Run a study: every combination of the axes x seeds, one process per cell. A rerun into the same
    folder skips finished cells; a crashed cell is recorded with its reason and the study goes on;
    Ctrl-C stops the running cell (its result is kept, marked incomplete) and leaves finished ones as
    they are. STUDY_FILE is a run file with a [sweep] table (see docs/studies.md)."""
    from rlbench.report.sweep import load_study, parse_grid, parse_sets, run_study

    study = load_study(study_file, sets=parse_sets(sets), grid=parse_grid(grid), seeds=_seeds_option(seeds),
                       name=name, target_return=target_return, target_window=target_window)
    folder = Path(out) if out else _default_folder(study_file, study.name)
    cells = study.cells()
    click.echo(f"study {study.name!r}: {len(cells) // len(study.seeds)} combination(s) x {len(study.seeds)} seed(s) "
               f"= {len(cells)} cells -> {folder}", err=True)
    if dry_run:
        from rlbench.plugins import get_registry
        from rlbench.report.sweep import _finished, refusal

        registry = get_registry()
        for cell in cells:
            state = "finished" if _finished(folder, cell) else (refusal(cell, registry) or "to run")
            click.echo(f"{cell.label}: {state}")
        return
    outcome = run_study(study, folder, parallel=parallel, echo=lambda text: click.echo(text, err=True))
    counts = {status: outcome.count(status) for status in ("complete", "skipped", "incomplete", "failed", "refused")}
    click.echo(", ".join(f"{n} {status}" for status, n in counts.items() if n) + f"; results in {folder}", err=True)
    if outcome.interrupted:
        click.echo(f"interrupted: rerun the same command (or rlbench sweep {folder / 'study.toml'}) to resume", err=True)
    click.echo(f"report: rlbench report {folder} --out {folder / 'report.html'}", err=True)
    if outcome.interrupted:
        sys.exit(130)
    if not outcome.ok:
        sys.exit(1)


@click.command("report", context_settings=CONTEXT)
@click.argument("results", nargs=-1, required=True, type=click.Path())
@click.option("--out", default="report.html", show_default=True, help="The HTML file to write.")
@click.option("--title", default="rlbench report", show_default=True)
@click.option("--target", "target_return", type=float, default=None,
              help="Target return for time-to-target (overrides the studies' own).")
@click.option("--target-window", type=int, default=None, help="Episodes averaged for the target.")
@click.option("--asv-benchmarks", default=None, metavar="REGEX", help="Only asv benchmarks whose name matches.")
@click.option("--screenshot", default=None, type=click.Path(dir_okay=False),
              help="Also write a PNG of the page's top as headless Chromium draws it.")
@click.option("--screenshot-size", default="1300x2200", show_default=True, metavar="WxH", help="Its window size.")
def report_command(results, out, title, target_return, target_window, asv_benchmarks, screenshot, screenshot_size):
    """Write one self-contained HTML page (figures embedded, opens offline) from results: rlbench
    result files, study folders, asv result folders (e.g. .asv/results) and `rlbench bench transport
    --json` files."""
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.html import build

    inputs = load_inputs(results)
    groups = group(inputs, target_return=target_return, target_window=target_window)
    page = build(inputs, groups, asv_pattern=asv_benchmarks, title=title)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    for skipped, why in inputs.skipped:
        click.echo(f"skipped {skipped}: {why}", err=True)
    click.echo(f"report: {path} ({len(inputs.runs)} results, {len(groups)} stud{'y' if len(groups) == 1 else 'ies'}, "
               f"{len(page) // 1024} KiB)")
    if screenshot:
        from rlbench.report import browser

        width, _, height = screenshot_size.partition("x")
        if not (width.isdigit() and height.isdigit()):
            raise RlbenchError(f"--screenshot-size takes WIDTHxHEIGHT, got {screenshot_size!r}")
        shot = browser.screenshot(path.resolve().as_uri(), screenshot, int(width), int(height))
        for message in shot.console:
            click.echo(f"warning: the page printed: {message}", err=True)
        click.echo(f"screenshot: {screenshot}")


@click.command("compare", context_settings=CONTEXT)
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--target", "target_return", type=float, default=None, help="Target return for time-to-target.")
def compare_command(a, b, target_return):
    """Two result sets (a result file or a folder each) side by side: per measure, both IQMs with their
    95 % intervals, and whether the difference lies outside them."""
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.compare import compare_lines

    a_inputs, b_inputs = load_inputs([a]), load_inputs([b])
    lines = compare_lines(a_inputs, b_inputs, group(a_inputs, target_return=target_return),
                          group(b_inputs, target_return=target_return), (a, b))
    click.echo("\n".join(lines))


@click.command("dashboard", context_settings=CONTEXT)
@click.option("--config", "config_path", default="asv.conf.json", show_default=True, help="asv's configuration.")
@click.option("--publish/--no-publish", default=True, show_default=True, help="Run asv publish first.")
@click.option("--serve/--no-serve", default=True, show_default=True, help="Serve the dashboard until Ctrl-C.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8080, show_default=True, help="0: any free port.")
def dashboard_command(config_path, publish, serve, host, port):
    """Publish asv's dashboard so it works offline (its CDN scripts replaced by local copies of the same
    libraries) and serve it."""
    from rlbench.report.dashboard import DEBIAN_PACKAGES, html_dir, make_offline, publish as asv_publish, serve as run_server

    html = asv_publish(config_path) if publish else html_dir(config_path)
    made = make_offline(html)
    click.echo(f"dashboard in {html} (its scripts and styles from {html / 'vendor'})", err=True)
    if made["remote"]:
        click.echo(f"warning: still loaded from the internet: {', '.join(made['remote'])} "
                   f"(apt-get install {DEBIAN_PACKAGES})", err=True)
    if serve:
        run_server(html, host, port, lambda text: click.echo(text))
