"""One JSON document per run (schema `rlbench.result/1`), and its human-readable rendering."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rlbench.errors import RlbenchError

SCHEMA = "rlbench.result/1"
REQUIRED = ("schema", "status", "config", "fingerprint", "throughput", "latency", "learning_curve",
            "timing", "energy", "accounting")


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _clean(value.item())
    return value


def result_path(out: str, config: dict[str, Any], started: float) -> Path:
    """`out` is a directory (a name is made up) or a path ending in .json."""
    path = Path(out)
    if path.suffix == ".json":
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    name = f"{config['algo']}-{config['env']}-{config.get('replay') or 'none'}-{config['compute']}-{config['placement']}-s{config['seed']}-{stamp}.json"
    return path / name.replace("/", "_")


def check_writable(out: str) -> None:
    """Refuse, before a run starts, an --out where its result could not be written (under /proc,
    below a regular file, a read-only folder): a run must never train and then lose its result."""
    path = Path(out)
    folder = path.parent if path.suffix == ".json" else path
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".rlbench-write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise RlbenchError(f"--out {out}: cannot write a result there ({exc.strerror or exc})") from None
    if path.suffix == ".json" and path.is_dir():
        raise RlbenchError(f"--out {out}: is a folder; give a folder, or a path ending in .json that is not one")


def write(result: dict[str, Any], out: str) -> Path:
    path = result_path(out, result["config"], result["timing"]["started_unix"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(result), indent=2, sort_keys=False))
    os.replace(tmp, path)
    return path


def load(path: str) -> dict[str, Any]:
    """A result document, checked; any file that is not one is a one-line RlbenchError."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise RlbenchError(f"no such result file: {path}") from None
    except IsADirectoryError:
        raise RlbenchError(f"{path} is a folder, not a result file") from None
    except OSError as exc:
        raise RlbenchError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RlbenchError(f"{path} is not a text file (binary data), so not an rlbench result") from None
    except json.JSONDecodeError as exc:
        raise RlbenchError(f"{path} is not JSON: {exc}") from None
    return check(data, str(path))


# the top-level fields every reader relies on, and their JSON types
FIELD_TYPES = {"status": str, "config": dict, "fingerprint": dict, "throughput": dict, "latency": dict,
               "learning_curve": list, "timing": dict, "energy": dict, "accounting": dict}
_TYPE_NAMES = {str: "a string", dict: "an object", list: "an array", float: "a number", int: "an integer",
               bool: "true or false"}


def check(data: Any, path: str) -> dict[str, Any]:
    """`data` is a result of the schema this rlbench reads, with its required fields of the right type."""
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("rlbench.result/"):
        raise RlbenchError(f"{path} is not an rlbench result (no 'schema': {SCHEMA!r})")
    if data["schema"] != SCHEMA:
        raise RlbenchError(f"{path} has schema {data['schema']}; this rlbench reads {SCHEMA}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise RlbenchError(f"{path} is missing {', '.join(missing)}")
    for key, kind in FIELD_TYPES.items():
        if not isinstance(data[key], kind):
            raise RlbenchError(f"{path}: field {key!r} should be {_TYPE_NAMES[kind]}, "
                               f"got {type(data[key]).__name__} {_short(data[key])}")
    return data


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def field(result: dict[str, Any], dotted: str, kind: type | tuple[type, ...] = float) -> Any:
    """The value at `dotted` (e.g. "timing.wall_s"), None when absent or null; a value of another
    type than `kind` (float accepts any number) is a one-line RlbenchError naming the field."""
    value: Any = result
    for part in dotted.split("."):
        if not isinstance(value, dict):
            raise RlbenchError(f"field {dotted!r}: {part!r} is inside {type(value).__name__} {_short(value)}, not an object")
        value = value.get(part)
        if value is None:
            return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds:
        kinds = (*kinds, int)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise RlbenchError(f"field {dotted!r} should be {_TYPE_NAMES.get(kinds[0], kinds[0].__name__)}, "
                           f"got {type(value).__name__} {_short(value)}")
    return value


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _scalars(block: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    """key=value for the scalar entries of a block (nested objects left to their own lines)."""
    parts = []
    for key, value in block.items():
        if key in skip or isinstance(value, (dict, list)) or value is None:
            continue
        parts.append(f"{key}={_fmt(value, 3) if isinstance(value, float) else value}")
    return " ".join(parts)


def _flatten(block: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(block, dict):
        return [item for key, value in block.items() for item in _flatten(value, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), block)]


def render(result: dict[str, Any]) -> str:
    """The summary `rlbench run` prints and `rlbench show` re-prints: every figure the result holds
    that a user would look for. A malformed field is a one-line RlbenchError, never a traceback."""
    where = result.get("path") or "result"
    try:
        return "\n".join(_render(result))
    except RlbenchError as exc:
        raise RlbenchError(f"{where}: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ArithmeticError) as exc:
        raise RlbenchError(f"{where}: malformed result ({type(exc).__name__}: {exc})") from None


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _render(result: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    status = field(result, "status", str) or "?"
    head = f"rlbench {result.get('rlbench_version', '?')}  {status.upper()}"
    if field(result, "status_reason", str):
        head += f" ({result['status_reason']})"
    stop_signal = field(result, "stop_signal", int)  # the signal's number (runner.py)
    if stop_signal and _signal_name(stop_signal) not in head:  # the reason usually names it already
        head += f", stopped by {_signal_name(stop_signal)}"
    lines.append(head)
    cfg = result["config"]
    placement = field(result, "config.placement", str) or "?"
    actors_on = cfg.get("actor_compute")  # the actors' backend, where it is not the learner's
    compute = cfg.get("compute") if actors_on in (None, cfg.get("compute")) else \
        f"{cfg.get('compute')} (actors: {actors_on})"
    lines.append(f"  {cfg.get('algo')} on {cfg.get('env')}  replay={cfg.get('replay') or '-'}  compute={compute}  "
                 f"placement={placement}  transport={cfg.get('transport') if placement != 'local' else '-'}  "
                 f"policy={cfg.get('policy', 'single-learner')}  learners={cfg.get('learners', 1)}  "
                 f"actors={cfg.get('actors')}  seed={cfg.get('seed')}")
    lines += _run_lines(result)
    group = field(result, "loop.learner_group", dict)
    if group:
        identical = group.get("parameters_identical")
        if "digest_every" not in group:  # a result from before digests: checksums compared before each update
            verdict = (f"{'identical' if identical else 'DIVERGED'} over {group.get('checked_updates', 0):,} "
                       "checked updates")
        else:
            compared = f"digests compared {group['digests_compared']:,} times, every {group['digest_every']:,} updates"
            verdict = (f"identical ({compared} and after the last, update {group['last_checked_update']:,})"
                       if identical else
                       f"not checked (a learner was lost before the parameters after the last update were compared; "
                       f"before that, {compared}, all equal)" if identical is None else
                       f"DIVERGED (digests differed after update {group.get('diverged_at_update')}; {compared})")
        lines.append(f"  learner group: {group['learners']} learners ({group['backend']}), parameters {verdict}")
        moved = group.get("collective_bytes") if isinstance(group.get("collective_bytes"), dict) else {}
        if moved:  # on each learner's link beside the replay traffic the roles' table shows
            lines.append("    collectives on each learner's link: " + ", ".join(
                f"{name} {_fmt(b.get('sent', 0) / 1e6, 1)} MB out / {_fmt(b.get('received', 0) / 1e6, 1)} MB in"
                for name, b in sorted(moved.items()) if isinstance(b, dict)) + f" ({group.get('collective_bytes_basis')})")
    study = field(result, "study", dict)
    if study:
        lines.append(f"  study {study.get('name')!r}, cell {study.get('cell')}")
    for note in field(result, "notes", list) or []:
        lines.append(f"  note: {note}")
    lines += _timing_lines(result)
    lines += _loop_lines(result)
    lines += _outcome_lines(result)
    lines += _device_lines(result)
    for name, energy in result["energy"].items():
        if not isinstance(energy, dict):
            raise RlbenchError(f"field 'energy.{name}' should be an object, got {_short(energy)}")
        kind = energy.get("kind")
        lines.append(f"  energy ({name}): {_fmt(energy.get('joules'))} J ({kind or 'not measured'}"
                     + (f": {energy['reason']}" if energy.get("reason") else "") + ")")
    lines += _latency_lines(result)
    lines += _role_lines(result)
    lines += _launcher_lines(result)
    lines += _time_split_lines(result)
    lines += _machine_state_lines(result)
    modelled = field(result, "modelled", dict) or {}
    for label, block in modelled.items():
        values = " ".join(f"{k}={_fmt(v, 4) if isinstance(v, float) else v}" for k, v in _flatten(block)
                          if k not in ("timing", "kind"))
        lines.append(f"  modelled, not measured ({label}): {values}")
    if result.get("path"):
        lines.append(f"  result: {result['path']}")
    return lines


def _timing_lines(result: dict[str, Any]) -> list[str]:
    wall = field(result, "timing.wall_s")
    cpu = field(result, "timing.cpu_s")
    util = field(result, "timing.cpu_utilisation")
    startup = field(result, "timing.startup_s")
    line = f"  wall {_fmt(wall)} s   cpu {_fmt(cpu)} s   utilisation {_fmt(util, 2)} cores"
    if startup is not None:
        line += f"   start-up {startup:.1f} s"
    lines = [line]
    lines.append(f"  env steps {_fmt(field(result, 'throughput.env_steps', int))} "
                 f"({_fmt(field(result, 'throughput.env_steps_per_s'))}/s)   "
                 f"updates {_fmt(field(result, 'throughput.updates', int))} ({_fmt(field(result, 'throughput.updates_per_s'))}/s)   "
                 f"samples {_fmt(field(result, 'throughput.samples_per_s'))}/s")
    steady = field(result, "throughput.steady_env_steps_per_s")
    if steady is not None:
        updates = field(result, "throughput.steady_updates_per_s")
        lines.append(f"  steady state (first to last env step): {steady:,.1f} env steps/s"
                     + (f", {updates:,.1f} updates/s" if updates is not None else ""))
    node_steady = field(result, "loop.steady_env_steps_per_s")
    if node_steady:
        lines.append(f"  steady state at the replay node (first to last INSERT): {node_steady:,.1f} env steps/s")
    return lines


def _loop_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    limiter = field(result, "loop.rate_limiter", dict)
    if limiter:
        lines.append(f"  rate limiter: samples per insert target {_fmt(field(result, 'loop.rate_limiter.samples_per_insert_target'))}, "
                     f"achieved {_fmt(field(result, 'loop.rate_limiter.samples_per_insert_achieved'))}"
                     f" (sampling from {_fmt(field(result, 'loop.rate_limiter.min_size_to_sample', int))} stored)")
    elif field(result, "loop.samples_per_insert") is not None:
        lines.append(f"  samples per insert achieved {result['loop']['samples_per_insert']:,.1f} (no rate limiter: one process)")
    depths = field(result, "loop.queue_depths", dict) or {}
    if depths:
        parts = [f"{name} p50 {_fmt(s.get('p50'))} max {_fmt(s.get('max'))}" for name, s in depths.items()
                 if isinstance(s, dict) and s.get("count")]
        if parts:
            lines.append("  queue depths: " + "; ".join(parts))
    lines += _weights_lines(result)
    rest = _scalars(field(result, "loop", dict) or {}, skip=("samples_per_insert", "steady_env_steps_per_s"))
    if rest:
        lines.append(f"  loop: {rest}")
    counters = field(result, "counters", dict) or {}
    if counters:
        lines.append("  counters: " + " ".join(f"{k}={_fmt(v)}" for k, v in counters.items()))
    return lines


def _weights_lines(result: dict[str, Any]) -> list[str]:
    """A distributed run's weights on the wire: one message's size, how many moved each way, and the
    bytes per learner update."""
    weights = field(result, "loop.weights", dict)
    if not weights or not weights.get("params_bytes"):
        return []
    per_update = field(result, "loop.weights.bytes_per_update", dict) or {}
    return [f"  weights: {_bytes(weights['params_bytes'])} a message; {_fmt(weights.get('published'))} published to the "
            f"replay node, {_fmt(weights.get('fetched'))} fetched by actors, over "
            f"{_fmt(weights.get('learner_updates'))} learner updates: per update {_bytes(per_update.get('published'))} learner -> node + "
            f"{_bytes(per_update.get('fetched'))} node -> actors = {_bytes(per_update.get('total'))}"]


def _bytes(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return f"{value / 1e6:,.2f} MB" if value >= 1e6 else f"{value / 1e3:,.1f} kB"


def _outcome_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    ev = field(result, "evaluation", dict) or {}
    if ev:
        solved = field(result, "evaluation.success_rate")
        extra = f"   success rate {solved:.2f}" if solved is not None else ""
        lines.append(f"  greedy evaluation over {ev.get('episodes')} episodes: mean return {_fmt(field(result, 'evaluation.mean_return'), 2)}"
                     f" (std {_fmt(field(result, 'evaluation.std_return'), 2)}){extra}")
    curve = result["learning_curve"]
    if curve:
        tail = curve[-min(10, len(curve)):]
        returns = [point.get("return") if isinstance(point, dict) else None for point in tail]
        if any(not isinstance(r, (int, float)) or isinstance(r, bool) for r in returns):
            raise RlbenchError("field 'learning_curve' should hold objects with a numeric 'return'")
        counted = field(result, "returns", dict) or {}  # raw, or what the training environment counts (Atari's clipped)
        lines.append(f"  training episodes {len(curve)}; mean return of the last {len(tail)}: {sum(returns) / len(tail):.2f}"
                     + "".join(f"   returns: {name.replace('_', ' ')} {kind}" for name, kind in counted.items() if kind))
        steps, values = _curve_points(curve, "learning_curve")
        window = min(10, len(values))
        smoothed = [sum(values[max(0, i - window + 1):i + 1]) / len(values[max(0, i - window + 1):i + 1])
                    for i in range(len(values))]
        lines.append(f"  learning curve (mean of the last {window} training returns, over env steps): "
                     + _sparkline(steps, smoothed))
    periodic = field(result, "evaluation_curve", dict)
    if periodic:
        points = field(result, "evaluation_curve.points", list) or []
        if points:
            steps, values = _curve_points(points, "evaluation_curve.points")
            lines.append(f"  evaluation curve (greedy, {_fmt(periodic.get('episodes'))} episodes every "
                         f"{_fmt(periodic.get('every'))} env steps): " + _sparkline(steps, values))
            lines.append("    env steps " + " ".join(f"{s:>8,}" for s in steps))
            lines.append("    return    " + " ".join(f"{v:>8.1f}" for v in values))
    acc = result["accounting"]
    dropped = field(result, "accounting.dropped", int)
    lines.append(f"  transitions produced {_fmt(field(result, 'accounting.produced', int))} = stored "
                 f"{_fmt(field(result, 'accounting.stored', int))} + dropped {_fmt(dropped)}"
                 + (f" {acc.get('dropped_by_cause')}" if dropped else ""))
    memory = field(result, "replay_stats", dict)
    shards = _shard_memories(result)
    if memory and shards:  # replay_stats is shard 0's memory: the run's is every shard's
        memory = {**memory, **{key: sum(shard.get(key) or 0 for shard in shards.values())
                               for key in ("size", "capacity", "overwritten")}}
    if memory:
        held = f" ({len(shards)} shards)" if shards else ""
        line = f"  replay memory{held}: {_fmt(memory.get('size'))} of {_fmt(memory.get('capacity'))} stored, " \
               f"{_fmt(memory.get('overwritten'))} overwritten"
        if memory.get("prioritized"):
            line += f", prioritized (alpha {_fmt(memory.get('alpha'), 2)})"
        frames = memory.get("frames")
        if isinstance(frames, dict) and frames.get("frames_held") is not None:
            line += (f"; each frame once: {_fmt(frames['frames_held'])} frames held "
                     f"({_fmt(frames.get('frame_bytes', 0) / 1e6, 1)} MB), {_fmt(frames.get('dedup_ratio'), 2)} "
                     f"references each ({_fmt(frames.get('frames'))} per stack)")
        lines.append(line)
    for name, shard in (field(result, "loop.replay_shards", dict) or {}).items():
        if not isinstance(shard, dict):
            raise RlbenchError(f"field 'loop.replay_shards.{name}' should be an object, got {_short(shard)}")
        own = shards.get(name, {})
        by = shard.get("stored_by") if isinstance(shard.get("stored_by"), dict) else {}
        limiter = shard.get("rate_limiter") if isinstance(shard.get("rate_limiter"), dict) else {}
        lines.append(f"    shard {name}: {_fmt(shard.get('size'))} of {_fmt(own.get('capacity'))} stored, produced "
                     f"{_fmt(shard.get('produced'))} (" + ", ".join(f"{actor} {_fmt(count)}" for actor, count in by.items())
                     + f"), steady {_fmt(shard.get('steady_env_steps_per_s'))} env steps/s, samples per insert "
                     f"{_fmt(limiter.get('samples_per_insert_achieved'))}")
    lines += _checkpoint_lines(result)
    return lines


def _shard_memories(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each replay shard's memory figures (--replay-shards), {} for a run with one replay node."""
    shards = field(result, "loop.replay_shards", dict) or {}
    return {name: shard["memory"] for name, shard in shards.items()
            if isinstance(shard, dict) and isinstance(shard.get("memory"), dict)}


def _checkpoint_lines(result: dict[str, Any]) -> list[str]:
    """The checkpoints this run wrote, the one it continued, and each actor replaced after it died."""
    lines = []
    written = field(result, "checkpoints", dict)
    if written:
        points = [point for point in field(result, "checkpoints.written", list) or [] if isinstance(point, dict)]
        line = f"  checkpoints: {len(points)} written to {written.get('directory')} every {_fmt(written.get('every_s'), 2)} s"
        if points:
            slowest = max((p["seconds"] for p in points if isinstance(p.get("seconds"), (int, float))), default=None)
            line += (f" (numbers {_fmt(points[0].get('number'))}..{_fmt(points[-1].get('number'))}), the last at env step "
                     f"{_fmt(points[-1].get('env_steps'))} after {_fmt(points[-1].get('learner_updates'))} learner updates; "
                     f"the slowest took {_fmt(slowest, 3)} s")
        lines.append(line)
    resumed = field(result, "resumed_from", dict)
    if resumed:
        lines.append(f"  resumed from {resumed.get('checkpoint')} in {resumed.get('directory')} (resume {_fmt(resumed.get('resumes'))}): "
                     f"{_fmt(resumed.get('env_steps'))} env steps, {_fmt(resumed.get('stored'))} stored, "
                     f"{_fmt(resumed.get('learner_updates'))} learner updates before this run")
    for replaced in field(result, "loop.actor_incarnations", list) or []:
        if not isinstance(replaced, dict):
            raise RlbenchError(f"field 'loop.actor_incarnations' should hold objects, got {_short(replaced)}")
        lines.append(f"  actor restarts: {replaced.get('died')} died ({replaced.get('why')}), replaced by "
                     f"{replaced.get('replaced_by')} (slot {replaced.get('slot')})")
    return lines


def _run_lines(result: dict[str, Any]) -> list[str]:
    """The rest of the run's configuration, its hyperparameters, components and the machine's fingerprint."""
    cfg = result["config"]
    shown = ("algo", "env", "replay", "compute", "actor_compute", "placement", "transport", "policy", "learners",
             "actors", "seed", "hyperparameters")
    schema = field(result, "schema", str) or "no schema"
    lines = [f"  run: {_scalars({k: v for k, v in cfg.items() if k not in shown})}   [{schema}]"]
    hp = field(result, "hyperparameters", dict) or {}
    if hp:
        lines.append("  hyperparameters: " + " ".join(f"{k}={v}" for k, v in hp.items()))
    components = field(result, "components", dict) or {}
    if components:
        lines.append("  components: " + " ".join(
            f"{kind}={c.get('name')}" + (f" [{c.get('plugin')}]" if c.get("plugin") not in (None, "builtin") else "")
            for kind, c in components.items() if isinstance(c, dict)))
    machine = field(result, "fingerprint", dict) or {}
    packages = machine.get("packages") if isinstance(machine.get("packages"), dict) else {}
    lines.append(f"  machine: {machine.get('hostname') or '?'}, {machine.get('cpu') or '?'} x{_fmt(machine.get('cores'))}, "
                 f"{machine.get('os') or '?'}, python {machine.get('python') or '?'}"
                 + "".join(f", {name} {version}" for name, version in packages.items()))
    return lines


SPARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 48


def _curve_points(points: list[Any], name: str) -> tuple[list[int], list[float]]:
    """(env steps, returns) of a curve's points; anything else is a one-line RlbenchError."""
    steps, values = [], []
    for point in points:
        step = point.get("step") if isinstance(point, dict) else None
        value = point.get("return") if isinstance(point, dict) else None
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (step, value)):
            raise RlbenchError(f"field {name!r} should hold objects with a numeric 'step' and 'return'")
        steps.append(int(step))
        values.append(float(value))
    return steps, values


def _sparkline(steps: list[int], values: list[float]) -> str:
    """The curve as one line of block characters: SPARK_WIDTH columns over env steps, each the last
    value reached by then, scaled between the curve's min and max."""
    low, high = min(values), max(values)
    first, last = steps[0], steps[-1]
    width = min(SPARK_WIDTH, len(values))
    columns, index = [], 0
    for column in range(width):
        until = first + (last - first) * (column + 1) / width
        while index + 1 < len(steps) and steps[index + 1] <= until:
            index += 1
        columns.append(values[index])
    span = high - low
    marks = "".join(SPARKS[int((v - low) / span * (len(SPARKS) - 1))] if span > 0 else SPARKS[0] for v in columns)
    return f"{marks}  {values[0]:,.1f} -> {values[-1]:,.1f} (min {low:,.1f}, max {high:,.1f}; steps {first:,}..{last:,})"


def _device_text(device: dict[str, Any]) -> str:
    name = device.get("device") or device.get("name") or "?"
    text = f"{name}"
    extra = [str(device[k]) for k in ("platform", "type") if device.get(k)]
    if extra:
        text += f" ({', '.join(extra)})"
    if device.get("emulation"):
        text += f" [emulated: {device.get('emulation_kind') or 'emulation'}]"
    return text


def _device_lines(result: dict[str, Any]) -> list[str]:
    """Where each component ran: its own report of a device, else its plugin's fingerprint."""
    plugins = field(result, "fingerprint.plugins", dict) or {}
    components = field(result, "components", dict) or {}
    lines = []
    for kind, component in components.items():
        if not isinstance(component, dict):
            continue
        device = component.get("device")
        if device is None and kind == "replay":
            device = (field(result, "replay_stats", dict) or {}).get("device")
        source = ""
        plugin = component.get("plugin")
        if device is None and plugin and plugin != "builtin" and isinstance(plugins.get(plugin), dict) \
                and plugins[plugin].get("device"):
            device, source = plugins[plugin], " (the plugin's fingerprint)"
        if isinstance(device, dict):
            lines.append(f"  device: {kind} {component.get('name')} on {_device_text(device)}{source}")
        elif isinstance(device, str):
            lines.append(f"  device: {kind} {component.get('name')} on {device}{source}")
        elif plugin and plugin != "builtin" and isinstance(plugins.get(plugin), dict):
            lines.append(f"  device: {kind} {component.get('name')}, per plugin {plugin}: {_scalars(plugins[plugin])}")
    return lines


def _latency_lines(result: dict[str, Any]) -> list[str]:
    latency = result["latency"]
    rows = [(op, s) for op, s in latency.items() if isinstance(s, dict) and s.get("count")]
    if not rows:
        return []
    width = max(20, *(len(op) for op, _ in rows))
    lines = [f"  latency (us)  {'':<{width - 12}}   count       p50       p90       p99       max"]
    for op, s in rows:
        values = [s.get(k) for k in ("p50", "p90", "p99", "max")]
        if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values + [s["count"]]):
            raise RlbenchError(f"field 'latency.{op}' should hold numbers, got {_short(s)}")
        lines.append(f"    {op:<{width}} {s['count']:>8,} " + " ".join(f"{v:>9.1f}" for v in values))
    return lines


def _role_lines(result: dict[str, Any]) -> list[str]:
    roles = field(result, "roles", dict) or field(result, "loop.roles", dict) or {}
    roles = {name: r for name, r in roles.items() if isinstance(r, dict)}
    if not roles:
        return []
    staleness = field(result, "loop.weights_staleness", dict) or {}
    lines = ["  role            host            wall s   cpu s  cpu/wall   msgs out    msgs in     MB out      MB in"
             "  weight staleness p50 / max (updates)"]
    for name, role in roles.items():
        link = role.get("link") if isinstance(role.get("link"), dict) else {}
        wall, cpu = role.get("wall_s"), role.get("cpu_s")
        util = cpu / wall if isinstance(wall, (int, float)) and isinstance(cpu, (int, float)) and wall > 0 else None
        stale = role.get("staleness") if isinstance(role.get("staleness"), dict) else staleness.get(name)
        stale_text = f"{_fmt(stale.get('p50'))} / {_fmt(stale.get('max'))}" if isinstance(stale, dict) and stale.get("count") else "-"
        mb_out = link.get("bytes_sent") / 1e6 if isinstance(link.get("bytes_sent"), (int, float)) else None
        mb_in = link.get("bytes_received") / 1e6 if isinstance(link.get("bytes_received"), (int, float)) else None
        lost = f"  lost {link.get('lost') or 0}" if link.get("lost") or link.get("sequence_resets") else ""
        if link.get("sequence_resets"):  # udp: gaps past what a peer may claim, whose loss is not in `lost`
            lost += f" (+{link['sequence_resets']} sequence resets, uncounted)"
        lines.append(f"    {name:<12} {str(role.get('host') or '-'):<14} {_fmt(wall, 2):>7} {_fmt(cpu, 2):>7} {_fmt(util, 2):>9} "
                     f"{_fmt(link.get('messages_sent')):>10} {_fmt(link.get('messages_received')):>10} "
                     f"{_fmt(mb_out, 2):>10} {_fmt(mb_in, 2):>10}  {stale_text}{lost}")
    for name, role in roles.items():  # an actor that joined a resumed or running run went on from its step
        if isinstance(role.get("started_at_step"), int) and role["started_at_step"] > 0:
            lines.append(f"    {name}: started at env step {role['started_at_step']:,} (the run's step when it joined)")
    for name, role in roles.items():  # a replay node's descriptor limit and who it kept out before they authenticated
        limit = role.get("descriptors")
        if isinstance(limit, dict) and limit:
            link = role.get("link") if isinstance(role.get("link"), dict) else {}
            kept_out = ", ".join(f"{counter.replace('_', ' ')} {_fmt(link[counter])}" for counter in
                                 ("strangers_shed", "handshake_timeouts", "accept_backoffs") if counter in link)
            lines.append(f"    {name}: open descriptors up to {_fmt(limit.get('soft'))} (was {_fmt(limit.get('soft_before'))}, "
                         f"hard limit {_fmt(limit.get('hard'))})" + (f"; {kept_out}" if kept_out else ""))
    return lines


def _launcher_lines(result: dict[str, Any]) -> list[str]:
    """A cluster launcher's run: the engine and its version, and each node: its roles, CPU, plugins."""
    launcher = field(result, "loop.launcher", dict) or {}
    if launcher.get("name") in (None, "local"):
        return []
    startup = launcher.get("startup_s")
    lines = [f"  launcher {launcher['name']} {launcher.get('ray_version') or ''} at {launcher.get('ray_address') or 'a Ray started for the run'}"
             + (f", start-up {_fmt(startup, 2)} s" if isinstance(startup, (int, float)) else "")]
    group = launcher.get("placement_group")
    if isinstance(group, dict):  # --placement-strategy: each bundle's roles and node
        bundles = [b for b in group.get("bundles") or [] if isinstance(b, dict)]
        lines.append(f"    placement group {group.get('strategy')} ({group.get('ray_strategy')}): {len(bundles)} bundles on "
                     f"{group.get('nodes')} node(s), reserved in {_fmt(group.get('reserve_s'), 2)} s"
                     f"{', removed' if group.get('removed') else ', NOT removed'}")
        lines.append("      " + "  ".join(f"{b.get('index')}:{'/'.join(map(str, b.get('roles') or []))}@"
                                          f"{str(b.get('node') or '-')[:12]}" for b in bundles))
    nodes = launcher.get("nodes") if isinstance(launcher.get("nodes"), dict) else {}
    for node_id, node in nodes.items():
        if not isinstance(node, dict):
            raise RlbenchError(f"field 'loop.launcher.nodes.{node_id}' should be an object, got {_short(node)}")
        fingerprint = node.get("fingerprint") if isinstance(node.get("fingerprint"), dict) else {}
        plugins = ",".join(sorted(fingerprint.get("plugins") or {})) or "-"
        lines.append(f"    node {str(node_id)[:12]}  {node.get('ip')}  {node.get('hostname') or '-'}: "
                     f"{', '.join(map(str, node.get('roles') or []))}   cpu {fingerprint.get('cpu', '-')} x{fingerprint.get('cores', '-')}"
                     f"  plugins {plugins}")
    return lines


def _time_split_lines(result: dict[str, Any]) -> list[str]:
    split = field(result, "time_split", dict) or field(result, "loop.time_split", dict) or {}
    split = {role: parts for role, parts in split.items() if isinstance(parts, dict)}
    if not split:
        return []
    columns = list(dict.fromkeys(k for parts in split.values() for k in parts if not k.endswith("_share")))
    lines = ["  time split (s)  " + "".join(f"{c:>12}" for c in columns)]
    for role, parts in split.items():
        lines.append(f"    {role:<13}" + "".join(f"{_fmt(parts.get(c), 2):>12}" for c in columns))
    share = field(result, "bookkeeping_share", float)
    if share is not None:
        lines.append(f"  rlbench's own bookkeeping: {share:.1%} of the roles' busy time (the rest is the components' work)")
    return lines


def _machine_state_lines(result: dict[str, Any]) -> list[str]:
    state = field(result, "machine_state", dict)
    if not state:
        return []
    loads = [f"{_fmt(state[k][0], 2) if isinstance(state.get(k), list) and state[k] else '-'}" for k in ("load_before", "load_after")]
    line = f"  machine state: load average {loads[0]} before, {loads[1]} after   "
    lines = [(line + _scalars(state, skip=("warning", "contended", "load_before", "load_after"))).rstrip()]
    for nested, block in state.items():
        if isinstance(block, dict):
            lines.append(f"    {nested}: {_scalars(block)}")
    warning = state.get("warning")
    noted = any(str(warning) in str(note) for note in field(result, "notes", list) or []) if warning else False
    if (state.get("contended") or warning) and not noted:
        lines.append(f"  WARNING: machine was contended{': ' + str(warning) if warning else ''}")
    return lines
