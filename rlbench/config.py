"""The resolved configuration of one run: which components, how long, which seed, and overrides;
and the TOML file that holds one (`rlbench run --config FILE`, the format `rlbench sweep` and
`rlbench plan` read and write).

A run file is the run's fields at the top level, `[hyperparameters]` for `--hp` overrides and
`[options]` for plugins' run options by their flag name without the dashes::

    algo = "dqn"
    env = "CartPole-v1"
    replay = "prioritized"
    placement = "server"
    transport = "shm"
    actors = 2
    steps = 20000

    [hyperparameters]
    learning_rate = 3e-4
    hidden_sizes = [64, 64]

    [options]
    upmem-dpus = 64

Other top-level tables (`[sweep]`, `[plan]`) belong to the commands that write them and are handed
back to the caller untouched.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlbench.errors import RlbenchError


@dataclass
class RunConfig:
    algo: str = "dqn"
    env: str = "CartPole-v1"
    replay: str | None = None  # None: "prioritized" for replay-loop algorithms, none for tabular ones
    compute: str = "cpu"  # the learner's backend (and every role's, unless actor_compute says otherwise)
    # the actors' policy inference (EMC2'20's setting: a learner on an accelerator, actors on CPUs);
    # None: the same as compute. Distributed placements only: placement local runs both in one process.
    actor_compute: str | None = None
    transport: str = "shm"  # between roles; used when placement is server or in-network
    placement: str = "local"
    policy: str = "single-learner"  # the distribution policy (MSRL): rlbench list --kind policy
    learners: int = 1  # learner processes, under a policy with several (data-parallel)
    actors: int = 1
    replay_shards: int = 1  # replay nodes; actors hashed to them, the learner sampling across them by priority mass
    num_envs: int = 1
    steps: int | None = None  # None: the algorithm's own budget (its Config.total_steps)
    seconds: float | None = None  # wall-clock budget; the run stops at whichever comes first
    seed: int = 0
    dataset: int | None = None  # offline learning over a collected dataset of this many transitions
    behaviour: str = "random"  # the dataset's behaviour policy
    eval_episodes: int = 10
    eval_every: int | None = None  # greedy evaluation every N env steps during training (placement local)
    on_actor_failure: str = "continue"  # or "stop": what a distributed run does when an actor dies
    actor_restarts: int = 0  # times each actor is replaced (a new incarnation) after it dies
    # distributed runs: checkpoint the learner and the replay node every N seconds, into this directory
    # (default: checkpoints/<time>-<algo>-<env>); `resume` continues the run a directory holds
    checkpoint_every: float | None = None
    checkpoint_dir: str | None = None
    resume: str | None = None
    launcher: str = "local"  # what starts a distributed run's roles: "local" processes, or "ray" (a Ray cluster)
    ray_address: str | None = None  # --launcher ray: "auto", "HOST:PORT", or None to start Ray for the run
    place: dict[str, Any] = field(default_factory=dict)  # role -> node(s): {"replay": N, "learner": N, "actors": [N, ...]}
    placement_strategy: str | None = None  # --launcher ray: pack, spread, strict-pack or strict-spread: the roles as one placement group's bundles
    bind: str | None = None  # the address server roles listen on (default: loopback, or the node's own address on Ray)
    hyperparameters: dict[str, Any] = field(default_factory=dict)  # overrides of the algorithm's Config
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> plugin options of the chosen component
    out: str | None = None  # directory (or .json path) for the result

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The flags `rlbench run` takes itself (rlbench/cli.py builds them; a test keeps the two equal): reserved,
# so no plugin's run option can take one, whatever order plugins load in.
RUN_FLAGS = frozenset({
    "--config", "--plan", "--algo", "--env", "--replay", "--compute", "--transport", "--placement", "--policy",
    "--actor-compute", "--learners", "--actors", "--replay-shards",
    "--num-envs", "--steps", "--seconds", "--seed", "--dataset", "--behaviour", "--eval-episodes", "--eval-every",
    "--on-actor-failure", "--actor-restarts", "--checkpoint-every", "--checkpoint-dir", "--resume", "--launcher", "--ray-address", "--place", "--bind", "--hp", "--out", "--no-out", "--json",
    "--placement-strategy",
    "--help",
})

# rlbench's own commands, by path under `rlbench`: reserved, as RUN_FLAGS are (a plugin adds commands,
# it never replaces one; tests/test_plugin_contract.py holds this to the CLI)
CORE_COMMANDS = frozenset({
    "run", "list", "info", "show", "sweep", "report", "compare", "dashboard", "profile", "plan", "ray", "bench",
    "bench access", "bench actors", "bench attacks", "bench compute", "bench ddpg", "bench dqn", "bench launchers",
    "bench matrix", "bench placement", "bench policies", "bench replay", "bench scale", "bench transport",
    "bench weights",
})


def actor_compute_of(config: RunConfig) -> str:
    """The compute backend a run's actors infer on: --actor-compute, else --compute."""
    return config.actor_compute or config.compute


# RunConfig.options and a Plan's components are keyed by component kind, but for the actors' backend
# where --actor-compute names another than --compute: its options and its entry go under this key.
ACTOR_COMPUTE = "actor_compute"


def component_kind(key: str) -> str:
    """The registry kind of a key of RunConfig.options or Plan.selected() ("actor_compute": "compute")."""
    return "compute" if key == ACTOR_COMPUTE else key


def parse_value(text: str) -> Any:
    """'1e-3' -> 0.001, '64,64' -> [64, 64], 'true' -> True, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if "," in text:
        return [parse_value(part) for part in text.split(",") if part.strip()]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def run_hyperparameters(algorithm: Any, config: RunConfig, registry: Any) -> Any:
    """A run's hyperparameters, one way everywhere (the runner, every role, the planner): the
    algorithm's Config defaults, then its preset for the environment's family (`algorithm.presets`,
    e.g. CleanRL's dqn_atari settings for "atari"; the environment's capabilities name the family),
    then the run's `--hp` overrides."""
    family = registry.get("environment", config.env).capabilities.family
    preset = dict(getattr(algorithm, "presets", {}).get(family, {}))
    return apply_overrides(algorithm.Config, {**preset, **config.hyperparameters})


def apply_overrides(config_cls: type, overrides: dict[str, Any]) -> Any:
    """Build an algorithm Config from its defaults and `--hp key=value` overrides, refusing
    unknown keys with a "did you mean"."""
    import difflib

    names = {f.name: f for f in dataclasses.fields(config_cls)}
    values = {}
    for key, value in overrides.items():
        if key not in names:
            close = difflib.get_close_matches(key, list(names), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(names))}"
            raise RlbenchError(f"unknown hyperparameter {key!r} for {config_cls.__name__}{hint}")
        default = getattr(config_cls, key, None) if not isinstance(names[key].default, dataclasses._MISSING_TYPE) else None
        if isinstance(default, tuple):
            value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
            element = type(default[0]) if default else None
            for item in value:  # each element as the default's elements: (128, 128) takes ints only
                if element is not None and not (isinstance(item, element) and not isinstance(item, bool)
                                                or element is float and isinstance(item, int) and not isinstance(item, bool)):
                    raise RlbenchError(f"hyperparameter {key} takes a list of {element.__name__}, got {item!r} in "
                                       f"{','.join(map(str, value))}")
            if element is float:
                value = tuple(float(item) for item in value)
        elif isinstance(default, bool) and not isinstance(value, bool):
            raise RlbenchError(f"hyperparameter {key} takes true or false, got {value!r}")
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif default is not None and not isinstance(value, type(default)) and not isinstance(default, tuple):
            raise RlbenchError(f"hyperparameter {key} takes a {type(default).__name__}, got {value!r}")
        values[key] = value
    return config_cls(**values)


# ------------------------------------------------------------------------------------------ run files
FILE_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig)
                    if f.name not in ("hyperparameters", "options", "place", "out"))
TABLES = ("hyperparameters", "options", "place")


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML document, or one line saying why it cannot be read."""
    import tomllib

    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise RlbenchError(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RlbenchError(f"cannot read {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RlbenchError(f"{path} is not valid TOML: {exc}") from None


def run_fields(document: dict[str, Any], *, source: str, extra_tables: tuple[str, ...] = ()) -> dict[str, Any]:
    """RunConfig keyword arguments from a run file's document (options still by flag name, under
    "options"); unknown keys are refused with the close match."""
    fields: dict[str, Any] = {}
    for key, value in document.items():
        if key in extra_tables:
            continue
        if key in TABLES:
            if not isinstance(value, dict):
                raise RlbenchError(f"{source}: [{key}] must be a table")
            fields[key] = dict(value)
        elif key in FILE_FIELDS:
            fields[key] = value
        else:
            known = [*FILE_FIELDS, *TABLES, *extra_tables]
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
            raise RlbenchError(f"{source}: unknown key {key!r}{hint}")
    return fields


def to_toml(document: dict[str, Any]) -> str:
    """TOML for the documents rlbench writes: scalars, arrays of scalars, nested tables; None is left out."""
    lines: list[str] = []
    _toml_table(document, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise RlbenchError(f"cannot write {type(value).__name__} {value!r} to TOML")


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _toml_table(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if v is not None and not isinstance(v, dict)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_toml_key(p) for p in path) + "]")
    for key, value in scalars.items():
        lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in tables.items():
        _toml_table(value, [*path, key], lines)


def run_document(config: RunConfig, option_flags: dict[tuple[str, str], str] | None = None) -> dict[str, Any]:
    """The run-file document of a configuration (the inverse of `run_fields`). `option_flags` maps
    (kind, param) to a plugin option's flag, so options are written by the name users type."""
    document = {name: getattr(config, name) for name in FILE_FIELDS
                if not (name == "transport" and config.placement == "local")}  # a local run has no transport
    if config.hyperparameters:
        document["hyperparameters"] = dict(config.hyperparameters)
    if config.place:
        document["place"] = dict(config.place)
    if config.options:
        flags = option_flags or {}
        document["options"] = {flags.get((component_kind(kind), param), param).lstrip("-"): value
                               for kind, values in config.options.items() for param, value in values.items()}
    return document
