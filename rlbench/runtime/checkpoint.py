"""A distributed run's checkpoints: what `--checkpoint-every` writes and `rlbench run --resume` reads.

One directory per run (its `run.json` says how the run was configured). Every checkpoint is a
numbered folder, `ckpt-000007/`, holding the learner (`learner.pt`: networks, optimizers, update
count, torch's RNG) and each replay node (`replay.npz`, `replay-1.npz` for shard 1, ...: the
memory's storage and priorities, its RNG, the rate limiter's counts, the node's counters and newest
weights). `LATEST` names the newest complete one. Reverb's checkpoints are the reference for the
nodes' part.

Consistency: learner 0 starts a checkpoint between two updates. It writes `learner.pt`, then asks
every replay node (Op.CHECKPOINT, the number only: a node writes only under its own directory),
each of which has by then handled every priority update the learner sent it (each channel is
ordered) and writes its file; once all have answered, the learner writes `LATEST`. Each file is
written to a temporary name and renamed (os.replace), and `LATEST` moves only after every file is
whole, so a run killed at any moment leaves `LATEST` naming a complete, matching set. Checkpoints
older than the KEEP newest are removed.

The directory must be visible from the learner's and the nodes' hosts at the same path (one
machine, or a shared filesystem across hosts, as RLlib's storage_path); a node checks the learner's
file is there before it writes its own, and refuses the checkpoint when it is not.

What a checkpoint does not hold: the actors' environments and episodes (a resumed run's actors
start new episodes, with new seeds) and transitions the killed run produced after the checkpoint
(they died with it: a resumed run counts from the checkpoint's step).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rlbench.errors import RlbenchError

MANIFEST = "run.json"
LATEST = "LATEST"
LEARNER_FILE = "learner.pt"
REPLAY_FILE = "replay.npz"
KEEP = 2  # complete checkpoints kept; older ones are removed once a newer one is whole
FORMAT = 1
_NAME = re.compile(r"ckpt-(\d{6,})")


class CheckpointError(RlbenchError):
    """A checkpoint directory that cannot be written or resumed from, said plainly."""


def folder(directory: str | Path, number: int) -> Path:
    return Path(directory) / f"ckpt-{number:06d}"


def write_atomically(path: Path, write: Callable[[Any], None]) -> None:
    """`write(file)` to a temporary name beside `path`, flushed to disk, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _write_json(path: Path, document: dict[str, Any]) -> None:
    write_atomically(path, lambda file: file.write(json.dumps(document, indent=1).encode()))


# ---------------------------------------------------------------------------------------- the run
def write_manifest(directory: str | Path, config: dict[str, Any], total_steps: int, resumes: int) -> None:
    """How the run is configured (RunConfig's fields), so `--resume DIR` runs it again as it was."""
    _write_json(Path(directory) / MANIFEST, {"format": FORMAT, "config": config, "total_steps": total_steps,
                                             "resumes": resumes})


def read_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not a checkpoint directory: it has no {MANIFEST} (a run started with "
                              "--checkpoint-every writes one)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    if document.get("format") != FORMAT:
        raise CheckpointError(f"{path} has checkpoint format {document.get('format')!r}; this rlbench reads {FORMAT}")
    return document


def replay_file(shard: int) -> str:
    return REPLAY_FILE if shard == 0 else f"replay-{shard}.npz"


def latest(directory: str | Path) -> dict[str, Any]:
    """The newest complete checkpoint: LATEST's record, its folder's path under "path"."""
    path = Path(directory) / LATEST
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{directory} holds no complete checkpoint yet (the run was stopped before its first; "
                              "a checkpoint needs the learner's first update)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    where = folder(directory, int(record["number"]))
    _check_whole(where, int(record.get("shards", 1)), f"{LATEST} names {where.name}, but")
    return {**record, "path": str(where)}


def _check_whole(where: Path, shards: int, said: str) -> None:
    for name in (LEARNER_FILE, *(replay_file(shard) for shard in range(shards))):
        if not (where / name).is_file():
            raise CheckpointError(f"{said} {where / name} is missing")


def commit(directory: str | Path, number: int, shards: int, record: dict[str, Any]) -> None:
    """Learner 0, once every node wrote its file: LATEST moves to `number`; checkpoints older than the
    KEEP newest go."""
    directory = Path(directory)
    _check_whole(folder(directory, number), shards, f"checkpoint {number} is not whole:")
    _write_json(directory / LATEST, {"number": number, "shards": shards, **record})
    numbers = sorted(int(m.group(1)) for p in directory.iterdir() if (m := _NAME.fullmatch(p.name)))
    for old in numbers[:-KEEP]:
        shutil.rmtree(folder(directory, old), ignore_errors=True)


# ---------------------------------------------------------------------------------------- learner
def save_learner(directory: str | Path, number: int, learner: Any) -> None:
    """The learner's half of checkpoint `number` (before it asks the node for the other)."""
    import torch

    state = {"learner": learner.state_dict(), "torch_rng": torch.get_rng_state(), "written_at": time.time()}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomically(folder(directory, number) / LEARNER_FILE, lambda file: file.write(buffer.getbuffer()))


def load_learner(checkpoint: str | Path, learner: Any) -> None:
    import torch

    # weights_only: a checkpoint is data; nothing in it is unpickled as code
    state = torch.load(Path(checkpoint) / LEARNER_FILE, map_location="cpu", weights_only=True)
    learner.load_state_dict(state["learner"])
    torch.set_rng_state(state["torch_rng"])


# ---------------------------------------------------------------------------------------- replay
def save_replay(directory: str | Path, number: int, shard: int, node_state: dict[str, Any], memory: Any) -> None:
    """A replay node's part of checkpoint `number`. Refused (nothing written) when the learner's part is
    not in the folder as this node sees it."""
    where = folder(directory, number)
    if not (where / LEARNER_FILE).is_file():
        raise CheckpointError(f"the learner's {LEARNER_FILE} is not in {where} as the replay node sees it: "
                              "--checkpoint-dir must be one directory every role's host sees (a shared filesystem)")
    node_state = dict(node_state)
    weights = node_state.pop("params", {})
    memory_state = memory.state_dict()
    meta = {"node": node_state, "memory": memory_state["meta"]}
    arrays = {f"memory.{name}": array for name, array in memory_state["arrays"].items()}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    arrays.update({f"params.{name}": array for name, array in weights.items()})
    write_atomically(where / replay_file(shard), lambda file: np.savez(file, **arrays))


def load_replay(checkpoint: str | Path, memory: Any, shard: int = 0) -> dict[str, Any]:
    """Restore the memory from a checkpoint; returns the node's saved state (counters, limiter, weights)."""
    with np.load(Path(checkpoint) / replay_file(shard), allow_pickle=False) as saved:
        meta = json.loads(bytes(saved["meta"]).decode())
        memory_arrays = {name.removeprefix("memory."): saved[name] for name in saved.files if name.startswith("memory.")}
        params = {name.removeprefix("params."): saved[name] for name in saved.files if name.startswith("params.")}
    memory.load_state_dict({"arrays": memory_arrays, "meta": meta["memory"]})
    node = meta["node"]
    node["params"] = dict(sorted(params.items(), key=lambda item: int(item[0][1:])))  # w0, w1, ... in order
    return node


# ---------------------------------------------------------------------------------------- a run's
def prepared(config: Any) -> Any:
    """The run's config with its checkpoint directory settled, before anything starts: the default
    directory when --checkpoint-every names none; refused when it cannot be written, when it holds
    another run's checkpoints (a new run would mix with them), or, for --resume, when it holds no
    complete checkpoint."""
    import dataclasses

    if config.resume is not None:
        latest(config.resume)
        read_manifest(config.resume)
        return dataclasses.replace(config, checkpoint_dir=config.resume)
    if not config.checkpoint_every:
        return config
    directory = config.checkpoint_dir or str(Path("checkpoints") / (time.strftime("%Y%m%d-%H%M%S", time.gmtime())
                                                                    + f"-{config.algo}-{config.env}"))
    if (Path(directory) / MANIFEST).exists():
        raise CheckpointError(f"--checkpoint-dir {directory} holds another run's checkpoints: continue it with "
                              f"`rlbench run --resume {directory}`, or give a new directory")
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        probe = Path(directory) / f".rlbench-write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"--checkpoint-dir {directory}: cannot write there ({exc.strerror or exc})") from None
    return dataclasses.replace(config, checkpoint_dir=directory)


def resumed_config(directory: str | Path, **own: Any) -> Any:
    """The RunConfig that continues the run in `directory`: as it was configured, with the settings
    a resumed run takes from its own command line (`own`: where its roles run, where its result goes)."""
    from rlbench.config import RunConfig

    fields = dict(read_manifest(directory)["config"])
    fields.update({name: value for name, value in own.items() if value is not None})
    fields.update(resume=str(directory), checkpoint_dir=str(directory))
    return RunConfig(**fields)
