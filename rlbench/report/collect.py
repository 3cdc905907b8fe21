"""What a report reads: rlbench results, a study's failure records, asv results and `rlbench bench
transport --json` output, from files or folders; grouped into studies and combinations.

A study is the results of one `rlbench sweep` (its "study" block names it; the combination is the
cell's values of the study's axes). Results that no sweep wrote are grouped by algorithm and
environment, and their combination is whatever setting varies among them (seed aside).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from rlbench.errors import RlbenchError

FAILURE_SCHEMA = "rlbench.sweep-failure/1"  # a study's record of a cell that failed (rlbench sweep writes it)

IGNORED_CONFIG = ("seed", "out", "total_steps")  # not what a combination is about


@dataclass
class Run:
    path: str
    data: dict[str, Any]

    @property
    def study(self) -> dict[str, Any] | None:
        block = self.data.get("study")
        return block if isinstance(block, dict) else None

    @property
    def complete(self) -> bool:
        return self.data.get("status") == "complete"

    @property
    def env(self) -> str:
        return str((self.data.get("config") or {}).get("env"))

    @property
    def contention(self) -> str | None:
        """Why the run's machine was contended (its machine_state warning), None when it was not."""
        state = self.data.get("machine_state")
        if isinstance(state, dict) and (state.get("contended") or state.get("warning")):
            return str(state.get("warning") or "contended").removeprefix("measured on a contended machine: ")
        return None

    def settings(self) -> dict[str, Any]:
        """The run's configuration as flat keys (hp.NAME, options.KIND.PARAM), seed left out."""
        config = self.data.get("config") or {}
        flat = {k: v for k, v in config.items() if k not in IGNORED_CONFIG and k not in ("hyperparameters", "options")}
        for key, value in (config.get("hyperparameters") or {}).items():
            flat[f"hp.{key}"] = value
        for kind, values in (config.get("options") or {}).items():
            for param, value in (values or {}).items():
                flat[f"options.{kind}.{param}"] = value
        return flat


@dataclass
class Failure:
    path: str
    study: dict[str, Any]
    reason: str


@dataclass
class Combination:
    label: str
    values: dict[str, Any]
    runs: list[Run] = field(default_factory=list)  # complete runs: the statistics are over these
    incomplete: list[Run] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    superseded: list[Run] = field(default_factory=list)  # a cell's contended run, rerun quiet (--rerun-contended)


@dataclass
class Group:
    """One study: its combinations, target and the runs' machines."""

    name: str
    axes: list[str]
    combinations: list[Combination]
    target_return: float | dict[str, float] | None = None  # one for every environment, or per environment
    target_window: int = 10
    concurrent_cells: int = 1
    from_sweep: bool = False
    reference_scores: dict[str, Any] = field(default_factory=dict)  # env -> ReferenceScore (built-in + the study's)
    prices: dict[str, float] = field(default_factory=dict)  # device kind -> USD per hour (--price)

    def runs(self) -> list[Run]:
        return [run for combination in self.combinations for run in combination.runs]

    def all_runs(self) -> list[Run]:
        return [run for c in self.combinations for run in (*c.runs, *c.incomplete, *c.superseded)]

    def target_for(self, env: str) -> float | None:
        if isinstance(self.target_return, dict):
            return self.target_return.get(env)
        return self.target_return

    @property
    def has_target(self) -> bool:
        return bool(self.target_return) or self.target_return == 0.0

    def target_text(self) -> str:
        """'return 100' or 'target' (per environment), for labels."""
        if isinstance(self.target_return, dict):
            return "target"
        return f"return {self.target_return:g}"

    def envs(self) -> list[str]:
        return list(dict.fromkeys(run.env for run in self.runs()))

    def contended(self) -> list[Run]:
        """Every run of the study measured on a contended machine, superseded ones too."""
        return [run for run in self.all_runs() if run.contention]


@dataclass
class Inputs:
    runs: list[Run] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    asv_results: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    asv_benchmarks: dict[str, Any] = field(default_factory=dict)  # asv's benchmarks.json: units
    transport_benches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)

    @property
    def empty(self) -> bool:
        return not (self.runs or self.failures or self.asv_results or self.transport_benches)


def _kind(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    schema = str(data.get("schema", ""))
    if schema.startswith("rlbench.result/"):
        return "result"
    if schema == FAILURE_SCHEMA:
        return "failure"
    if {"commit_hash", "results", "result_columns"} <= set(data):
        return "asv-result"
    if "machine" in data and "version" in data and "results" not in data:
        return "asv-machine"
    if data and all(isinstance(v, dict) and "type" in v and "name" in v for k, v in data.items() if k != "version"):
        return "asv-benchmarks"
    if isinstance(data.get("transports"), dict) and "sizes" in data:
        return "transport-bench"
    return None


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise RlbenchError(f"{path} is not a text file (binary data)") from None
    except json.JSONDecodeError as exc:
        raise RlbenchError(f"{path} is not JSON: {exc}") from None
    except OSError as exc:
        raise RlbenchError(f"cannot read {path}: {exc.strerror or exc}") from None


def load_inputs(paths: Iterable[str]) -> Inputs:
    """Every readable input under `paths`. A file named on the command line that cannot be read is
    an error; a file inside a folder that is not an input is listed as skipped, with the reason."""
    from rlbench.results import check

    inputs = Inputs()
    for given in paths:
        root = Path(given)
        if not root.exists():
            raise RlbenchError(f"no such file or folder: {given}")
        files = sorted(p for p in root.rglob("*.json") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            try:
                data = _read(path)
                kind = _kind(data)
                if kind == "result":
                    inputs.runs.append(Run(str(path), check(data, str(path))))
                elif kind == "failure":
                    study = data.get("study")
                    if not isinstance(study, dict) or not isinstance(study.get("combination"), dict):
                        raise RlbenchError(f"{path}: failure record without its study block")
                    inputs.failures.append(Failure(str(path), study, str(data.get("reason"))))
                elif kind == "asv-result":
                    inputs.asv_results.append((str(path), data))
                elif kind == "asv-benchmarks":
                    inputs.asv_benchmarks.update({k: v for k, v in data.items() if k != "version"})
                elif kind == "transport-bench":
                    inputs.transport_benches.append((str(path), data))
                elif kind != "asv-machine":
                    raise RlbenchError(f"{path} is neither an rlbench result nor asv's or a benchmark's output")
            except RlbenchError as exc:
                if not root.is_dir():
                    raise
                inputs.skipped.append((str(path), str(exc)))
    if inputs.empty:
        raise RlbenchError(f"no rlbench results, study records or asv results in {', '.join(map(str, paths))}")
    return inputs


def _label(values: dict[str, Any]) -> str:
    if not values:
        return "all runs"
    return " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in values.items())


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True, default=str)


def _preferred(runs: list[Run]) -> tuple[Run, list[Run]]:
    """Of one cell's complete runs (a contended one and its reruns), the one the statistics use: the
    last measured on a quiet machine, else the last; and the others, kept beside it."""
    quiet = [run for run in runs if not run.contention]
    chosen = (quiet or runs)[-1]
    return chosen, [run for run in runs if run is not chosen]


def reference_scores(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The built-in environments' random and reference scores, with the study's own over them."""
    from rlbench.builtin.reference_scores import REFERENCE_SCORES, ReferenceScore

    scores: dict[str, Any] = dict(REFERENCE_SCORES)
    for block in blocks:
        for env, entry in (block.get("reference_scores") or {}).items():
            scores[env] = ReferenceScore(float(entry["random"]), float(entry["reference"]), "the study file's")
    return scores


def group(inputs: Inputs, *, target_return: float | None = None, target_window: int | None = None,
          prices: dict[str, float] | None = None) -> list[Group]:
    """Studies with their combinations, in the order the sweep's axes (or the files) give."""
    by_study: dict[str, list[Run]] = {}
    for run in inputs.runs:
        block = run.study
        config = run.data.get("config") or {}
        name = str(block.get("name")) if block else f"{config.get('algo')} on {config.get('env')}"
        by_study.setdefault(name, []).append(run)
    failures_by_study: dict[str, list[Failure]] = {}
    for failure in inputs.failures:
        failures_by_study.setdefault(str(failure.study.get("name")), []).append(failure)
    groups = []
    for name in list(dict.fromkeys([*by_study, *failures_by_study])):
        runs = by_study.get(name, [])
        failures = failures_by_study.get(name, [])
        blocks = [run.study for run in runs if run.study] + [f.study for f in failures]
        if blocks:
            axes = list(dict.fromkeys(axis for block in blocks for axis in block.get("axes") or []))
            values_of = {id(run): {a: (run.study or {}).get("combination", {}).get(a) for a in axes} for run in runs}
        else:
            settings = {id(run): run.settings() for run in runs}
            keys = list(dict.fromkeys(k for s in settings.values() for k in s))
            axes = [k for k in keys if len({_hashable(s.get(k)) for s in settings.values()}) > 1]
            values_of = {id(run): {a: settings[id(run)].get(a) for a in axes} for run in runs}
        combinations: dict[str, Combination] = {}
        by_cell: dict[tuple[str, str], list[Run]] = {}
        for run in sorted(runs, key=lambda r: _number((r.data.get("timing") or {}).get("started_unix"))):
            values = values_of[id(run)]
            key = _hashable(values)
            combination = combinations.setdefault(key, Combination(_label(values), values))
            cell = (run.study or {}).get("cell")
            if run.complete and cell is not None:
                by_cell.setdefault((key, str(cell)), []).append(run)
            else:
                (combination.runs if run.complete else combination.incomplete).append(run)
        for (key, _), cell_runs in by_cell.items():  # one run per cell; a rerun's other runs kept aside
            chosen, others = _preferred(cell_runs)
            combinations[key].runs.append(chosen)
            combinations[key].superseded += others
        for failure in failures:
            values = {a: failure.study.get("combination", {}).get(a) for a in axes}
            combinations.setdefault(_hashable(values), Combination(_label(values), values)).failures.append(failure)
        # a seed that failed once and later completed is not a failure any more
        for combination in combinations.values():
            done = {(run.study or {}).get("cell") for run in combination.runs}
            combination.failures = [f for f in combination.failures if f.study.get("cell") not in done]
        first = blocks[0] if blocks else {}
        target = target_return if target_return is not None else first.get("target_return")
        if isinstance(target, (int, float)):
            target = float(target)
        window = target_window or first.get("target_window") or 10
        ordered = _ordered(list(combinations.values()), blocks, axes, runs)
        groups.append(Group(name, axes, ordered, target, int(window),
                            max([int(b.get("concurrent_cells") or 1) for b in blocks] or [1]), bool(blocks),
                            reference_scores(blocks), dict(prices or {})))
    return groups


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _ordered(combinations: list[Combination], blocks: list[dict[str, Any]], axes: list[str],
             runs: list[Run] | None = None) -> list[Combination]:
    """The study file's order: each axis's values as its [sweep] table lists them (the study block's
    axis_values, else the study.toml beside the runs), then the order the cells started in (the
    sweep's, seeds outermost), never the file names'; without a sweep, sorted by label."""
    if not blocks:
        return sorted(combinations, key=lambda c: c.label)
    positions: dict[str, list[str]] = {a: [] for a in axes}
    for axis, listed in _axis_values(blocks, runs or []).items():
        if axis in positions and isinstance(listed, list):
            positions[axis] = [_hashable(value) for value in listed]
    started = sorted(runs or [], key=lambda r: _number((r.data.get("timing") or {}).get("started_unix")))
    requested = [run.study.get("combination") or {} for run in started if run.study] + \
                [b.get("combination") or {} for b in blocks]
    for values in requested:
        for axis in axes:
            text = _hashable(values.get(axis))
            if text not in positions[axis]:
                positions[axis].append(text)
    return sorted(combinations, key=lambda c: tuple(positions[a].index(_hashable(c.values.get(a)))
                                                    if _hashable(c.values.get(a)) in positions[a] else math.inf
                                                    for a in axes))


def _axis_values(blocks: list[dict[str, Any]], runs: list[Run]) -> dict[str, Any]:
    """Each axis's values in the study file's order: from a study block (sweeps write axis_values),
    else from the study.toml a sweep leaves beside its runs/ folder (older results)."""
    for block in blocks:
        if isinstance(block.get("axis_values"), dict):
            return block["axis_values"]
    from rlbench.config import read_toml

    for folder in dict.fromkeys(Path(run.path).parent for run in runs):
        for candidate in (folder / "study.toml", folder.parent / "study.toml"):
            try:
                table = read_toml(candidate).get("sweep")
            except (OSError, RlbenchError, ValueError):
                continue
            if isinstance(table, dict) and table.get("name") == blocks[0].get("name"):
                return {k: v for k, v in table.items() if isinstance(v, list)}
    return {}


MACHINE_KEYS = ("hostname", "cpu", "machine", "cores", "cores_usable", "memory_bytes", "os")  # what a machine is


def fingerprints(runs: list[Run]) -> list[dict[str, Any]]:
    """The fingerprint of each distinct machine the runs came from (by host, CPU, cores, memory and OS;
    what changes on one machine between runs, such as its network interfaces, does not count)."""
    seen: dict[str, dict[str, Any]] = {}
    for run in runs:
        fingerprint = run.data.get("fingerprint") or {}
        seen.setdefault(_hashable({k: fingerprint.get(k) for k in MACHINE_KEYS}), fingerprint)
    return list(seen.values())
