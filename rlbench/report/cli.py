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
              help="Target return for the to-target measures: reached at the first of 3 consecutive --eval-every "
                   "evaluations at or above it; without evaluations, when the mean of the last --target-window "
                   "training episodes first reaches it.")
@click.option("--target-window", type=int, default=None, help="Episodes averaged for the target [default: 10].")
@click.option("--out", default=None, help="Results folder [default: results/studies/NAME].")
@click.option("--parallel", type=int, default=1, show_default=True,
              help="Cells at once, each its own process (they then share this machine's cores: the report says so).")
@click.option("--dry-run", is_flag=True, help="List the cells and which would run, and stop.")
@click.option("--until-ci", default=None, metavar="WIDTH",
              help="Then add seeds, one round at a time, to each combination whose 95 % interval of --ci-measure is "
                   "wider than WIDTH (in the measure's unit, or 10% of its IQM), up to --max-seeds.")
@click.option("--ci-measure", default=None, metavar="KEY",
              help="The measure --until-ci narrows (steps_to_target, final_return, env_steps_per_s, ...) "
                   "[default: the verdict's: steps_to_target with a target, else final_return].")
@click.option("--max-seeds", type=int, default=20, show_default=True, help="--until-ci's seed cap per combination.")
@click.option("--rerun-contended", type=int, default=0, metavar="N",
              help="Then rerun cells measured on a contended machine, N reruns at most; both runs are kept, the "
                   "report uses the quiet one.")
def sweep_command(study_file, grid, sets, seeds, name, target_return, target_window, out, parallel, dry_run,
                  until_ci, ci_measure, max_seeds, rerun_contended):
    """Run a study: every combination of the axes x seeds, one process per cell. A rerun into the same
    folder skips finished cells; a crashed cell is recorded with its reason and the study goes on;
    Ctrl-C stops the running cell (its result is kept, marked incomplete) and leaves finished ones as
    they are. STUDY_FILE is a run file with a [sweep] table (see docs/studies.md)."""
    from rlbench.report.sweep import Precision, add_seeds, load_study, parse_grid, parse_sets, rerun_contended as rerun, run_study

    precision = Precision.parse(until_ci, ci_measure, max_seeds) if until_ci else None
    if ci_measure and not until_ci:
        raise RlbenchError("--ci-measure says which interval --until-ci narrows: give --until-ci WIDTH too")
    study = load_study(study_file, sets=parse_sets(sets), grid=parse_grid(grid), seeds=_seeds_option(seeds),
                       name=name, target_return=target_return, target_window=target_window)
    if precision is not None:
        precision.check(study)  # a misspelt --ci-measure stops here, not after the whole sweep ran
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
    echo = lambda text: click.echo(text, err=True)  # noqa: E731
    outcome = run_study(study, folder, parallel=parallel, echo=echo)
    more = []
    if not outcome.interrupted and rerun_contended:
        more += rerun(study, folder, rerun_contended, parallel=parallel, echo=echo)
    if not outcome.interrupted and precision and not any(o.interrupted for o in more):
        more += add_seeds(study, folder, precision, parallel=parallel, echo=echo)
    for extra in more:
        outcome.outcomes += extra.outcomes
        outcome.interrupted = outcome.interrupted or extra.interrupted
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
@click.option("--price", "prices", multiple=True, metavar="NAME=USD_PER_HOUR",
              help="For the cost in dollars: cpu=USD per CPU-hour, or a device component (gpu, fpga, ...)=USD per "
                   "hour held. Repeatable.")
def report_command(results, out, title, target_return, target_window, asv_benchmarks, screenshot, screenshot_size,
                   prices):
    """Write one self-contained HTML page (figures embedded, opens offline) from results: rlbench
    result files, study folders, asv result folders (e.g. .asv/results) and `rlbench bench transport
    --json` files."""
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.html import build

    inputs = load_inputs(results)
    groups = group(inputs, target_return=target_return, target_window=target_window,
                   prices=parse_prices(prices, inputs))
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


def parse_prices(items: tuple[str, ...], *inputs) -> dict[str, float]:
    """--price NAME=USD_PER_HOUR, NAME being cpu or a device some run used (its component's name)."""
    from rlbench.report.measures import priced_devices

    known = list(dict.fromkeys(d for given in inputs for run in given.runs for d in priced_devices(run)))
    prices = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not sep or not name or not value >= 0:
            raise RlbenchError(f"--price {item!r} is not NAME=USD_PER_HOUR (cpu=0.04, gpu=2.5)")
        if name not in known:
            import difflib

            close = difflib.get_close_matches(name, known, n=1)
            raise RlbenchError(f"--price {name}: no run used {name!r}"
                               + (f"; did you mean {close[0]!r}?" if close else f" (priced here: {', '.join(known)})"))
        prices[name] = value
    return prices


@click.command("compare", context_settings=CONTEXT)
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path(), required=False)
@click.option("--a", "select_a", multiple=True, metavar="KEY=VALUE",
              help="Within one study (A is its folder, no B): the combinations of side A, by axis value. Repeatable.")
@click.option("--b", "select_b", multiple=True, metavar="KEY=VALUE", help="The same for side B.")
@click.option("--target", "target_return", type=float, default=None, help="Target return for the to-target measures.")
@click.option("--price", "prices", multiple=True, metavar="NAME=USD_PER_HOUR",
              help="For the cost in dollars (as rlbench report's). Repeatable.")
def compare_command(a, b, select_a, select_b, target_return, prices):
    """Two result sets (a result file or a folder each), or two sets of combinations of one study
    (rlbench compare STUDY --a replay=uniform --b replay=prioritized), side by side: per measure,
    both IQMs with their 95 % intervals (the range below 5 seeds), whether the difference lies
    outside them, the verdict on env steps to the target, the costs, and the contended runs."""
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.compare import compare_lines, compare_within

    if select_a or select_b:
        if b is not None:
            raise click.UsageError("--a/--b select within one study: give its folder alone (compare STUDY --a K=V --b K=V)")
        if not (select_a and select_b):
            raise click.UsageError("give both --a and --b")
        inputs = load_inputs([a])
        groups = group(inputs, target_return=target_return, prices=parse_prices(prices, inputs))
        click.echo("\n".join(compare_within(inputs, groups, select_a, select_b, a)))
        return
    if b is None:
        raise click.UsageError("give two result sets (compare A B), or one study with --a and --b")
    a_inputs, b_inputs = load_inputs([a]), load_inputs([b])
    priced = parse_prices(prices, a_inputs, b_inputs)
    lines = compare_lines(a_inputs, b_inputs, group(a_inputs, target_return=target_return, prices=priced),
                          group(b_inputs, target_return=target_return, prices=priced), (a, b))
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
