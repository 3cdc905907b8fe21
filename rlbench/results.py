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


def write(result: dict[str, Any], out: str) -> Path:
    path = result_path(out, result["config"], result["timing"]["started_unix"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(result), indent=2, sort_keys=False))
    os.replace(tmp, path)
    return path


def load(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise RlbenchError(f"no such result file: {path}") from None
    except json.JSONDecodeError as exc:
        raise RlbenchError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("rlbench.result/"):
        raise RlbenchError(f"{path} is not an rlbench result (no 'schema': {SCHEMA!r})")
    if data["schema"] != SCHEMA:
        raise RlbenchError(f"{path} has schema {data['schema']}; this rlbench reads {SCHEMA}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise RlbenchError(f"{path} is missing {', '.join(missing)}")
    return data


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def render(result: dict[str, Any]) -> str:
    """The summary table `rlbench run` prints and `rlbench show` re-prints."""
    cfg = result["config"]
    lines = []
    status = result["status"]
    head = f"rlbench {result.get('rlbench_version', '?')}  {status.upper()}"
    if result.get("status_reason"):
        head += f" ({result['status_reason']})"
    lines.append(head)
    lines.append(f"  {cfg['algo']} on {cfg['env']}  replay={cfg.get('replay') or '-'}  compute={cfg['compute']}  "
                 f"placement={cfg['placement']}  transport={cfg.get('transport') if cfg['placement'] != 'local' else '-'}  "
                 f"actors={cfg['actors']}  seed={cfg['seed']}")
    for note in result.get("notes", []):
        lines.append(f"  note: {note}")
    t = result["timing"]
    tp = result["throughput"]
    lines.append(f"  wall {t['wall_s']:.1f} s   cpu {t['cpu_s']:.1f} s   utilisation {t['cpu_utilisation']:.2f} cores")
    lines.append(f"  env steps {_fmt(tp['env_steps'])} ({_fmt(tp['env_steps_per_s'])}/s)   updates {_fmt(tp['updates'])} "
                 f"({_fmt(tp['updates_per_s'])}/s)   samples {_fmt(tp['samples_per_s'])}/s")
    steady = (result.get("loop") or {}).get("steady_env_steps_per_s")
    if steady:
        lines.append(f"  steady state (first to last INSERT at the replay node): {steady:,.1f} env steps/s")
    ev = result.get("evaluation") or {}
    if ev:
        solved = ev.get("success_rate")
        extra = f"   success rate {solved:.2f}" if solved is not None else ""
        lines.append(f"  greedy evaluation over {ev['episodes']} episodes: mean return {_fmt(ev['mean_return'], 2)}"
                     f" (std {_fmt(ev['std_return'], 2)}){extra}")
    curve = result["learning_curve"]
    if curve:
        tail = curve[-min(10, len(curve)):]
        mean_tail = sum(p["return"] for p in tail) / len(tail)
        lines.append(f"  training episodes {len(curve)}; mean return of the last {len(tail)}: {mean_tail:.2f}")
    acc = result["accounting"]
    lines.append(f"  transitions produced {_fmt(acc['produced'])} = stored {_fmt(acc['stored'])} + dropped {_fmt(acc['dropped'])}"
                 + (f" {acc['dropped_by_cause']}" if acc["dropped"] else ""))
    for name, energy in result["energy"].items():
        lines.append(f"  energy ({name}): {_fmt(energy.get('joules'))} J ({energy.get('kind') or 'not measured'}"
                     + (f": {energy['reason']}" if energy.get("reason") else "") + ")")
    if result["latency"]:
        lines.append("  latency (us)            count       p50       p90       p99       max")
        for op, s in result["latency"].items():
            if s.get("count"):
                lines.append(f"    {op:<20} {s['count']:>8,} {s['p50']:>9.1f} {s['p90']:>9.1f} {s['p99']:>9.1f} {s['max']:>9.1f}")
    for label, block in (result.get("modelled") or {}).items():
        lines.append(f"  modelled ({label}): {json.dumps(block, default=str)}")
    if result.get("path"):
        lines.append(f"  result: {result['path']}")
    return "\n".join(lines)
