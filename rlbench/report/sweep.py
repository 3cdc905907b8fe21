"""Studies: a grid over components and hyperparameters x seeds, each cell one `rlbench.run` in a
child process, every result in one folder that a rerun resumes.

A study file is a run file (`rlbench.config`: the run's fields, `[hyperparameters]`, `[options]`)
plus a `[sweep]` table, so `rlbench run --config` and `rlbench sweep` read the same format::

    algo = "dqn"
    env = "CartPole-v1"
    steps = 10000
    eval_episodes = 5

    [hyperparameters]
    learning_starts = 500

    [sweep]
    name = "replay-placement"        # the results folder's name (default: the file's stem)
    seeds = 5                        # seeds 0..4, or a list: [0, 1, 2]
    target_return = 150.0            # to-target measures (a number, or a table per environment): the
    target_window = 10               #   first of 3 consecutive evaluations at or above it; without
                                     #   --eval-every, the mean of the last `target_window` episodes
    replay = ["prioritized", "uniform"]     # an axis over a run field,
    placement = ["local", "server"]
    "hp.learning_rate" = [1e-3, 3e-4]       # over a hyperparameter,
    "options.dpus" = [16, 64]               # or over a plugin's run option (its flag, no dashes)

Every combination of the axes runs once per seed. Seeds are the outer loop, so a study stopped
half-way has every combination at its first seeds. The results folder holds::

    study.toml              the study as run: `rlbench sweep OUT/study.toml` reruns (resumes) it
    runs/<cell>.json        a cell's result (schema rlbench.result/1) with a "study" block
    runs/<cell>.failed.json a cell that crashed or was refused, with the reason
    runs/<cell>.log         what the cell's process printed

A rerun skips every cell whose result is complete and was run with the same settings; it runs
again the failed and interrupted ones. Each cell is a child process: a crash (even a segfault) is
recorded as that cell's failure and the study goes on; Ctrl-C stops the running cell (its result
is written, marked incomplete) and the study, and leaves every finished result as it was.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rlbench.config import FILE_FIELDS, RunConfig, parse_value, read_toml, run_fields, to_toml
from rlbench.errors import RlbenchError, UnknownComponentError
from rlbench.report.collect import FAILURE_SCHEMA
SWEEP_KEYS = ("name", "seeds", "target_return", "target_window", "reference_scores")
DEFAULT_SEEDS = 5
DEFAULT_WINDOW = 10
INCOMPLETE_EXIT = 3  # the child wrote a result marked incomplete


# ---------------------------------------------------------------------------------------- the study
@dataclass
class Cell:
    """One run of the study: a combination of the axes' values and a seed."""

    combination: dict[str, Any]
    seed: int
    document: dict[str, Any]  # the run file of this cell
    attempt: int = 0  # 0: the cell's run; K: its K-th rerun (--rerun-contended), kept beside it

    @property
    def id(self) -> str:
        parts = [f"{key}-{_slug(value)}" for key, value in self.combination.items()] + [f"seed-{self.seed}"]
        return re.sub(r"[^A-Za-z0-9.=_-]+", "-", "_".join(parts))

    @property
    def stem(self) -> str:
        """Its files' name: the cell's id, and the attempt for a rerun."""
        return self.id + (f".rerun-{self.attempt}" if self.attempt else "")

    @property
    def label(self) -> str:
        return " ".join([f"{key}={_show(value)}" for key, value in self.combination.items()] + [f"seed={self.seed}"]
                        + ([f"rerun {self.attempt}"] if self.attempt else []))


@dataclass
class Study:
    name: str
    base: dict[str, Any]  # run-file document shared by every cell
    axes: dict[str, list[Any]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: list(range(DEFAULT_SEEDS)))
    target_return: float | dict[str, float] | None = None  # one for every environment, or one per environment
    target_window: int = DEFAULT_WINDOW
    reference_scores: dict[str, dict[str, float]] = field(default_factory=dict)  # env -> {random, reference}

    def document(self) -> dict[str, Any]:
        """The study file of this study (what `study.toml` holds)."""
        sweep: dict[str, Any] = {"name": self.name, "seeds": list(self.seeds)}
        if self.target_return is not None:
            sweep["target_return"] = self.target_return
        sweep["target_window"] = self.target_window
        if self.reference_scores:
            sweep["reference_scores"] = self.reference_scores
        sweep.update(self.axes)
        return {**self.base, "sweep": sweep}

    def combinations(self) -> list[dict[str, Any]]:
        return [dict(zip(self.axes, values)) for values in itertools.product(*self.axes.values())]

    def cell(self, combination: dict[str, Any], seed: int, attempt: int = 0) -> Cell:
        return Cell(combination, seed, _apply(self.base, {**combination, "seed": seed}), attempt)

    def cells(self) -> list[Cell]:
        cells = [self.cell(combination, seed) for seed in self.seeds for combination in self.combinations()]
        ids: dict[str, Cell] = {}
        for cell in cells:
            if cell.id in ids:
                raise RlbenchError(f"cells {ids[cell.id].label!r} and {cell.label!r} would share the file name "
                                   f"{cell.id}.json: give the axis values distinct spellings")
            ids[cell.id] = cell
        return cells

    def block(self, cell: Cell, concurrent: int) -> dict[str, Any]:
        """The "study" block written into each cell's result."""
        return {"name": self.name, "cell": cell.id, "combination": cell.combination, "seed": cell.seed,
                "axes": list(self.axes), "axis_values": self.axes,  # the report's row order: the study file's
                "target_return": self.target_return, "target_window": self.target_window,
                "reference_scores": self.reference_scores, "requested": cell.document, "concurrent_cells": concurrent}


def _slug(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "x".join(_slug(v) for v in value)
    return str(value).replace("/", "_")


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _check_key(key: str, source: str) -> None:
    """An axis or --set key: a run field, hp.NAME or options.FLAG (seeds have their own key)."""
    if key == "seed":
        raise RlbenchError(f"{source}: seeds are given by 'seeds' (a count or a list), not by an axis over 'seed'")
    if key.startswith(("hp.", "options.")) and key.split(".", 1)[1]:
        return
    if key not in FILE_FIELDS:
        known = [*FILE_FIELDS, "hp.<hyperparameter>", "options.<flag>"]
        close = difflib.get_close_matches(key, [k for k in FILE_FIELDS if k != "seed"] + list(SWEEP_KEYS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
        raise RlbenchError(f"{source}: unknown key {key!r}{hint}")


def _apply(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of the run-file document `base` with `values` (keys: field, hp.NAME, options.FLAG) set."""
    document = json.loads(json.dumps(base))
    for key, value in values.items():
        if key.startswith("hp."):
            document.setdefault("hyperparameters", {})[key[3:]] = value
        elif key.startswith("options."):
            document.setdefault("options", {})[key[8:]] = value
        else:
            document[key] = value
    return document


def _seeds(value: Any, source: str) -> list[int]:
    if isinstance(value, bool) or not isinstance(value, (int, list)):
        raise RlbenchError(f"{source}: seeds is a count or a list of integers, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise RlbenchError(f"{source}: seeds must be at least 1, got {value}")
        return list(range(value))
    if not value or not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise RlbenchError(f"{source}: seeds is a count or a non-empty list of integers, got {value!r}")
    if len(set(value)) != len(value):
        raise RlbenchError(f"{source}: seeds repeat: {value}")
    return list(value)


def parse_grid(items: tuple[str, ...] | list[str]) -> dict[str, list[Any]]:
    """`--grid KEY=V1,V2` (values separated by ';' instead when a value is itself a list: 64,64;128,128)."""
    axes: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise RlbenchError(f"--grid {item!r} is not KEY=VALUE,VALUE...")
        parts = raw.split(";") if ";" in raw else raw.split(",")
        axes[key.strip()] = [parse_value(part.strip()) for part in parts if part.strip()]
    return axes


def parse_sets(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE`: a field of every cell (KEY as in the grid)."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise RlbenchError(f"--set {item!r} is not KEY=VALUE")
        values[key.strip()] = parse_value(raw.strip())
    return values


def load_study(path: str | None = None, *, sets: dict[str, Any] | None = None,
               grid: dict[str, list[Any]] | None = None, seeds: Any = None, name: str | None = None,
               target_return: float | None = None, target_window: int | None = None) -> Study:
    """A study from a study file (or none) and command-line additions, which win over the file."""
    source = path or "the command line"
    document = read_toml(path) if path else {}
    table = document.pop("sweep", {})
    if not isinstance(table, dict):
        raise RlbenchError(f"{source}: [sweep] must be a table")
    run_fields(document, source=source)  # unknown top-level keys are refused here, with the close match
    for key, value in (sets or {}).items():
        _check_key(key, "--set")
        document = _apply(document, {key: value})
    axes: dict[str, list[Any]] = {}
    for key, values in {**{k: v for k, v in table.items() if k not in SWEEP_KEYS}, **(grid or {})}.items():
        _check_key(key, source if key in table else "--grid")
        if not isinstance(values, list) or not values:
            raise RlbenchError(f"{source}: axis {key!r} takes a non-empty list of values, got {values!r}")
        axes[key] = values  # an axis overrides the base value of its key
    if seeds is None:
        seeds = table.get("seeds", DEFAULT_SEEDS)
    target = target_return if target_return is not None else table.get("target_return")
    window = target_window if target_window is not None else table.get("target_window", DEFAULT_WINDOW)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise RlbenchError(f"{source}: target_window is a positive integer, got {window!r}")
    study_name = name or table.get("name") or (Path(path).stem if path else _derived_name(document, axes))
    if not isinstance(study_name, str) or not study_name.strip():
        raise RlbenchError(f"{source}: name is a non-empty string, got {study_name!r}")
    return Study(name=study_name, base=document, axes=axes, seeds=_seeds(seeds, source),
                 target_return=_target(target, source), target_window=window,
                 reference_scores=_reference_scores(table.get("reference_scores", {}), source))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _target(value: Any, source: str) -> float | dict[str, float] | None:
    """target_return: a number for every environment, or a table environment -> number."""
    if value is None:
        return None
    if _is_number(value):
        return float(value)
    if isinstance(value, dict) and value and all(_is_number(v) for v in value.values()):
        return {str(env): float(v) for env, v in value.items()}
    raise RlbenchError(f"{source}: target_return is a number or a table of one number per environment "
                       f"({{\"CartPole-v1\" = 195, \"Acrobot-v1\" = -100}}), got {value!r}")


def _reference_scores(value: Any, source: str) -> dict[str, dict[str, float]]:
    """[sweep.reference_scores]: environment -> {random = R, reference = S}, S != R."""
    if not isinstance(value, dict):
        raise RlbenchError(f"{source}: reference_scores is a table of environments, got {value!r}")
    scores = {}
    for env, entry in value.items():
        if not isinstance(entry, dict) or set(entry) != {"random", "reference"} \
                or not all(_is_number(v) for v in entry.values()):
            raise RlbenchError(f"{source}: reference_scores.{env} takes two numbers, "
                               f"{{random = R, reference = S}}, got {entry!r}")
        if entry["random"] == entry["reference"]:
            raise RlbenchError(f"{source}: reference_scores.{env}: random and reference are both {entry['random']}: "
                               "nothing to normalise by")
        scores[str(env)] = {"random": float(entry["random"]), "reference": float(entry["reference"])}
    return scores


def _derived_name(document: dict[str, Any], axes: dict[str, list[Any]]) -> str:
    """A stable name for a study given on the command line, so the same command resumes it."""
    parts = [str(document.get("algo", RunConfig.algo)), str(document.get("env", RunConfig.env))]
    parts += [key.replace("hp.", "").replace("options.", "") for key in axes] or ["seeds"]
    return "-".join(parts).replace("/", "_")


def run_config(document: dict[str, Any], registry: Any, *, source: str = "study") -> RunConfig:
    """The RunConfig of a run-file document; plugin options go from flag names to their component."""
    from rlbench.validate import options_from_flags

    fields = run_fields(document, source=source)
    flags = fields.pop("options", {})
    config = RunConfig(**fields)
    config.options = options_from_flags(flags, config, registry)
    return config


def refusal(cell: Cell, registry: Any) -> str | None:
    """Why the runner would refuse this cell before starting (None: it would start). A misspelt
    component name raises instead: it is a mistake in the study, not a finding."""
    from rlbench.runner import check

    try:
        check(run_config(cell.document, registry), registry)
    except UnknownComponentError:
        raise
    except RlbenchError as exc:
        return str(exc)
    except (TypeError, ValueError) as exc:  # a wrongly typed field in the study file
        return f"invalid setting: {exc}"
    return None


# ------------------------------------------------------------------------------------ the outcome
@dataclass
class CellOutcome:
    cell: Cell
    status: str  # complete | skipped (finished before) | incomplete | failed | refused
    reason: str | None = None
    seconds: float = 0.0
    summary: str = ""


@dataclass
class StudyOutcome:
    study: Study
    folder: Path
    outcomes: list[CellOutcome]
    interrupted: bool = False

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(o.status in ("complete", "skipped") for o in self.outcomes)


def _result_path(folder: Path, cell: Cell) -> Path:
    return folder / "runs" / f"{cell.stem}.json"


def _failure_path(folder: Path, cell: Cell) -> Path:
    return folder / "runs" / f"{cell.stem}.failed.json"


def _finished(folder: Path, cell: Cell) -> bool:
    """A complete result of this cell with the same settings is there; a result with other settings
    stops the study (its folder belongs to a different study)."""
    path = _result_path(folder, cell)
    if not path.exists():
        return False
    try:
        data = json.loads(path.read_text())
        requested = data["study"]["requested"]
        status = data["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return False  # unreadable or cut short: run it again
    if requested != cell.document:
        changed = sorted(k for k in set(requested) | set(cell.document) if requested.get(k) != cell.document.get(k))
        raise RlbenchError(f"{path} was run with other settings ({', '.join(changed)} differ): this folder holds "
                           f"another study; choose another --out, or delete the folder to start over")
    return status == "complete"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    from rlbench.results import _clean

    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2))
    os.replace(tmp, path)


def _record_failure(folder: Path, study: Study, cell: Cell, reason: str, exit_code: int | None,
                    concurrent: int) -> None:
    _write_json(_failure_path(folder, cell), {
        "schema": FAILURE_SCHEMA, "study": study.block(cell, concurrent), "reason": reason, "exit_code": exit_code,
        "log": f"runs/{cell.stem}.log", "finished_unix": time.time()})


def _one_line_summary(result: dict[str, Any]) -> str:
    throughput = result.get("throughput") or {}
    evaluation = result.get("evaluation") or {}
    parts = [f"{throughput.get('env_steps_per_s') or 0:,.0f} env steps/s"]
    if evaluation.get("mean_return") is not None:
        parts.append(f"greedy return {evaluation['mean_return']:.1f}")
    return ", ".join(parts)


def _failure_reason(log: Path, exit_code: int) -> str:
    """The last line the cell printed that says what went wrong, else how it ended."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"the cell's process was killed by {name}" + (f" after: {lines[-1]}" if lines else "")
    for line in reversed(lines):
        if line.startswith("error: ") or re.match(r"^[A-Za-z_.]+(Error|Exception|Interrupt)\b", line):
            return line.removeprefix("error: ")
    return f"exit code {exit_code}" + (f": {lines[-1]}" if lines else "")


# -------------------------------------------------------------------------------------- running
@dataclass
class _Child:
    cell: Cell
    process: subprocess.Popen
    log: Any
    started: float
    step: int = 0
    total: int = 0

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.total) if self.total else 0.0


class _Bar:
    """The study's progress on stderr: on a terminal one redrawn line; otherwise (a log, CI, a pipe)
    a plain line per running cell every `plain_every_s` seconds, so a long cell is not silent for
    minutes. Finished cells get a line either way."""

    PLAIN_EVERY_S = 30.0

    def __init__(self, total: int, done: int, echo: Callable[[str], None], *, tty: bool | None = None,
                 plain_every_s: float | None = None) -> None:
        self.total, self.done, self.echo = total, done, echo
        self.to_run = total - done
        self.finished_now = 0
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.plain_every_s = self.PLAIN_EVERY_S if plain_every_s is None else plain_every_s
        self.last_plain = self.t0

    def line(self, text: str) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
        self.echo(text)

    def _eta(self, running: list[_Child]) -> tuple[float, float]:
        fraction = (self.finished_now + sum(c.fraction for c in running)) / max(1, self.to_run)
        elapsed = time.perf_counter() - self.t0
        return elapsed, elapsed / fraction * (1 - fraction) if fraction > 0.01 else math.nan

    def draw(self, running: list[_Child]) -> None:
        if not self.tty:
            self._plain(running)
            return
        elapsed, eta = self._eta(running)
        fraction = (self.finished_now + sum(c.fraction for c in running)) / max(1, self.to_run)
        now = "; ".join(f"{c.cell.label} " + (f"{c.step:,}/{c.total:,} steps" if c.total else "starting")
                        for c in running)
        bar = "#" * int(fraction * 24)
        text = (f"\r\033[K[{bar:<24}] {self.done}/{self.total} cells  {_clock(elapsed)} elapsed"
                f"{'  ' + _clock(eta) + ' left' if math.isfinite(eta) else ''}  {now}")
        sys.stderr.write(text[:220])
        sys.stderr.flush()

    def _plain(self, running: list[_Child]) -> None:
        """Without a terminal: one line per running cell, at most every plain_every_s seconds."""
        if not running or time.perf_counter() - self.last_plain < self.plain_every_s:
            return
        self.last_plain = time.perf_counter()
        elapsed, eta = self._eta(running)
        for child in running:
            steps = (f"{child.step:,}/{child.total:,} env steps ({child.fraction:.0%})" if child.total
                     else "starting")
            self.echo(f"[{self.done}/{self.total} cells] {child.cell.label}: {steps}; study {_clock(elapsed)} elapsed"
                      + (f", about {_clock(eta)} left" if math.isfinite(eta) else ""))

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def run_study(study: Study, folder: str | Path, *, parallel: int = 1, registry: Any = None,
              echo: Callable[[str], None] = print, cells: list[Cell] | None = None) -> StudyOutcome:
    """Run every cell (the study's, or `cells`) not finished before, `parallel` at a time, each in
    its own process."""
    from rlbench.plugins import get_registry

    if parallel < 1:
        raise RlbenchError(f"--parallel must be at least 1, got {parallel}")
    registry = registry or get_registry()
    folder = Path(folder)
    cells = study.cells() if cells is None else cells
    refused = {cell.stem: refusal(cell, registry) for cell in cells}
    if all(refused.values()):
        raise RlbenchError(f"no cell of study {study.name!r} can run: {next(iter(refused.values()))}")
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    finished = {cell.stem for cell in cells if _finished(folder, cell)}
    (folder / "study.toml").write_text(f"# rlbench study; rerun (resume) with: rlbench sweep {folder / 'study.toml'}\n"
                                       + to_toml(study.document()))
    outcomes: dict[str, CellOutcome] = {}
    pending: list[Cell] = []
    for cell in cells:
        if cell.stem in finished:
            outcomes[cell.stem] = CellOutcome(cell, "skipped", "finished before")
        elif refused[cell.stem]:
            outcomes[cell.stem] = CellOutcome(cell, "refused", refused[cell.stem])
            _record_failure(folder, study, cell, refused[cell.stem], None, parallel)
        else:
            pending.append(cell)
    bar = _Bar(len(cells), len(outcomes), echo)
    if finished:
        bar.line(f"{len(finished)} of {len(cells)} cells finished before: skipped")
    for cell in cells:
        if outcomes.get(cell.stem, CellOutcome(cell, "")).status == "refused":
            bar.line(f"[{cell.label}] refused: {refused[cell.stem]}")

    interrupts = 0
    running: list[_Child] = []

    def on_interrupt(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        # The child runs in its own session (so the terminal's Ctrl-C reaches it once, from here):
        # the first signal asks it to stop and write its result, a second interrupts it at once.
        for child in running:
            try:
                os.killpg(child.process.pid, signal.SIGKILL if interrupts >= 3 else signal.SIGINT)
            except ProcessLookupError:
                pass

    previous = signal.signal(signal.SIGINT, on_interrupt) if _main_thread() else None
    selector = selectors.DefaultSelector()
    try:
        while (pending and not interrupts) or running:
            while pending and not interrupts and len(running) < parallel:
                child = _start(study, pending.pop(0), folder, parallel)
                running.append(child)
                selector.register(child.process.stdout, selectors.EVENT_READ, child)
            for key, _ in selector.select(timeout=0.5):
                child = key.data
                line = child.process.stdout.readline()
                if line:
                    step, _, total = line.strip().partition(" ")
                    if step.isdigit() and total.isdigit():
                        child.step, child.total = int(step), int(total)
                else:
                    selector.unregister(child.process.stdout)
            for child in [c for c in running if c.process.poll() is not None]:
                if child.process.stdout in [k.fileobj for k in selector.get_map().values()]:
                    selector.unregister(child.process.stdout)
                running.remove(child)
                outcome = _finish(study, child, folder, parallel)
                outcomes[child.cell.stem] = outcome
                bar.done += 1
                bar.finished_now += 1
                text = f"[{bar.done}/{bar.total}] {child.cell.label}: {outcome.status} in {outcome.seconds:.1f} s"
                bar.line(text + (f", {outcome.summary}" if outcome.summary else "")
                         + (f" ({outcome.reason})" if outcome.reason else ""))
            bar.draw(running)
    finally:
        selector.close()
        bar.close()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    ordered = [outcomes[cell.stem] for cell in cells if cell.stem in outcomes]
    return StudyOutcome(study, folder, ordered, interrupted=interrupts > 0)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _start(study: Study, cell: Cell, folder: Path, concurrent: int) -> _Child:
    spec = {"document": cell.document, "study": study.block(cell, concurrent),
            "result": str(_result_path(folder, cell))}
    log = open(folder / "runs" / f"{cell.stem}.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "rlbench.report.sweep", json.dumps(spec)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True,
                               bufsize=1, start_new_session=True)
    return _Child(cell, process, log, time.perf_counter())


def _finish(study: Study, child: _Child, folder: Path, concurrent: int) -> CellOutcome:
    child.process.wait()
    child.process.stdout.close()
    child.log.close()
    code = child.process.returncode
    seconds = time.perf_counter() - child.started
    cell = child.cell
    result = None
    if code in (0, INCOMPLETE_EXIT):
        try:
            result = json.loads(_result_path(folder, cell).read_text())
        except (OSError, ValueError):
            result = None
    if result is not None and result.get("status") == "complete":
        _failure_path(folder, cell).unlink(missing_ok=True)
        return CellOutcome(cell, "complete", None, seconds, _one_line_summary(result))
    if result is not None:
        return CellOutcome(cell, "incomplete", result.get("status_reason") or "incomplete", seconds)
    reason = _failure_reason(folder / "runs" / f"{cell.stem}.log", code)
    _record_failure(folder, study, cell, reason, code, concurrent)
    return CellOutcome(cell, "failed", reason, seconds)


# ---------------------------------------------------------------------- more seeds, quiet reruns
@dataclass
class Precision:
    """--until-ci: add seeds to a combination until the interval of `measure` is narrower than
    `width` (an absolute width in the measure's unit, or with `relative` a fraction of its IQM), or
    it has `max_seeds` seeds."""

    width: float
    relative: bool = False
    measure: str | None = None  # a measure's key; None: the study's default verdict's
    max_seeds: int = 20

    @classmethod
    def parse(cls, text: str, measure: str | None, max_seeds: int) -> "Precision":
        raw = text.strip()
        relative = raw.endswith("%")
        try:
            width = float(raw[:-1] if relative else raw)
        except ValueError:
            raise RlbenchError(f"--until-ci takes a width (25, in the measure's unit) or a share of the IQM (10%), "
                               f"got {text!r}") from None
        if not width > 0 or not math.isfinite(width):
            raise RlbenchError(f"--until-ci takes a positive width, got {text!r}")
        if max_seeds < 1:
            raise RlbenchError(f"--max-seeds must be at least 1, got {max_seeds}")
        return cls(width / 100 if relative else width, relative, measure, max_seeds)

    def check(self, study: "Study") -> None:
        """Refuse a measure no study can have, before any cell runs (and under --dry-run)."""
        from rlbench.report.measures import check_measure_key

        if self.measure is not None:
            check_measure_key(self.measure, has_target=study.target_return is not None)

    def limit(self, estimate: Any) -> float:
        """The widest interval asked for, in the measure's unit."""
        return self.width * abs(estimate.value) if self.relative else self.width

    def narrow(self, estimate: Any) -> bool:
        """A 95 % interval (not a small sample's range) at most `width` wide."""
        if estimate.kind != "ci" or not math.isfinite(estimate.low) or not math.isfinite(estimate.high):
            return False
        return estimate.high - estimate.low <= self.limit(estimate)


def plain_number(value: float) -> str:
    """A width as people write it: 12,345 or 0.0042, never 1.234e+04."""
    if not math.isfinite(value):
        return "unbounded" if value > 0 else str(value)
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    places = max(1, 2 - math.floor(math.log10(abs(value))))  # three significant digits
    return f"{value:,.{places}f}"


def _study_group(study: Study, folder: Path):
    from rlbench.report.collect import group, load_inputs

    try:
        inputs = load_inputs([str(folder / "runs")])
    except RlbenchError:
        return None
    return next((g for g in group(inputs) if g.name == study.name), None)


def _combination_key(values: dict[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def _seeds_tried(folder: Path, study: Study) -> dict[str, set[int]]:
    """The seeds each combination has a result or a failure record for."""
    tried: dict[str, set[int]] = {}
    for path in (folder / "runs").glob("*.json"):
        try:
            block = json.loads(path.read_text()).get("study") or {}
        except (OSError, ValueError):
            continue
        if block.get("name") == study.name and isinstance(block.get("seed"), int):
            tried.setdefault(_combination_key(block.get("combination") or {}), set()).add(block["seed"])
    return tried


def add_seeds(study: Study, folder: str | Path, precision: Precision, *, parallel: int = 1, registry: Any = None,
              echo: Callable[[str], None] = print) -> list[StudyOutcome]:
    """Round by round, one more seed for every combination whose interval is still wider than asked."""
    from rlbench.report.compare import default_measure
    from rlbench.report.measures import estimate, measures

    folder = Path(folder)
    rounds = []
    while True:
        found = _study_group(study, folder)
        if found is None:
            return rounds
        available = measures(found)
        key = precision.measure or getattr(default_measure(available), "key", None)
        measure = next((m for m in available if m.key == key), None)
        if measure is None:
            keys = [m.key for m in available]
            close = difflib.get_close_matches(str(key), keys, n=1)
            raise RlbenchError(f"--ci-measure {key!r} is not a measure of this study"
                               + (f"; did you mean {close[0]!r}?" if close else f" (its measures: {', '.join(keys)})"))
        tried = _seeds_tried(folder, study)
        cells = []
        for combination in study.combinations():
            values = {a: combination.get(a) for a in study.axes}
            match = next((c for c in found.combinations if _combination_key(c.values) == _combination_key(values)), None)
            seeds = tried.get(_combination_key(combination), set())
            if match is None or len(seeds) >= precision.max_seeds:
                continue
            e = estimate(measure, match, found)
            if not precision.narrow(e):
                seed = next(s for s in itertools.count(max(seeds | set(study.seeds)) + 1) if s not in seeds)
                cells.append(study.cell(combination, seed))
                echo(f"--until-ci: {match.label}: {measure.label} interval "
                     + (f"{plain_number(e.high - e.low)} wide (asked: {plain_number(precision.limit(e))})"
                        if e.kind == "ci" else f"not yet a 95 % interval ({e.n} runs)")
                     + f", adding seed {seed}")
        if not cells:
            return rounds
        outcome = run_study(study, folder, parallel=parallel, registry=registry, echo=echo, cells=cells)
        rounds.append(outcome)
        if outcome.interrupted:
            return rounds


def rerun_contended(study: Study, folder: str | Path, limit: int, *, parallel: int = 1, registry: Any = None,
                    echo: Callable[[str], None] = print) -> list[StudyOutcome]:
    """Rerun the cells whose every complete run was measured on a contended machine, at most `limit`
    reruns in all; each rerun is kept beside the runs before it (runs/<cell>.rerun-K.json), and the
    report uses a cell's last quiet run."""
    if limit < 0:
        raise RlbenchError(f"--rerun-contended takes how many reruns at most, got {limit}")
    folder = Path(folder)
    rounds, done = [], 0
    while done < limit:
        found = _study_group(study, folder)
        if found is None:
            return rounds
        attempts: dict[str, int] = {}
        for path in (folder / "runs").glob("*.rerun-*.json"):
            cell_id, _, number = path.name.removesuffix(".failed.json").removesuffix(".json").rpartition(".rerun-")
            if number.isdigit():
                attempts[cell_id] = max(attempts.get(cell_id, 0), int(number))
        cells = []
        for combination in found.combinations:
            for run in combination.runs:  # a cell's chosen run is contended only when none of its runs was quiet
                block = run.study or {}
                if run.contention and block.get("cell") and len(cells) + done < limit:
                    wanted = study.cell(block.get("combination") or {}, int(block.get("seed")),
                                        attempts.get(str(block["cell"]), 0) + 1)
                    if wanted.id == block["cell"]:
                        cells.append(wanted)
                        echo(f"--rerun-contended: {wanted.label} (was: {run.contention})")
        if not cells:
            return rounds
        outcome = run_study(study, folder, parallel=parallel, registry=registry, echo=echo, cells=cells)
        rounds.append(outcome)
        done += len(cells)
        if outcome.interrupted:
            return rounds
    return rounds


# ------------------------------------------------------------------------------- the cell process
def _set_parent_death_signal() -> None:
    """Linux: if the study's process dies, this cell is asked to stop (as by Ctrl-C)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGINT))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _cell_main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    progress_out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else the run prints goes to the cell's log, not into the progress pipe
    _set_parent_death_signal()
    import rlbench
    from rlbench.results import write

    last = [0.0]

    def progress(step: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= 0.2 or step >= total:
            last[0] = now
            try:
                progress_out.write(f"{int(step)} {int(total)}\n")
            except (BrokenPipeError, ValueError):
                pass

    try:
        config = run_config(spec["document"], rlbench.get_registry())
        result = rlbench.run(config, progress=progress)
    except RlbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["study"] = spec["study"]
    write(result, spec["result"])
    return 0 if result["status"] == "complete" else INCOMPLETE_EXIT


if __name__ == "__main__":
    sys.exit(_cell_main(sys.argv[1:]))
