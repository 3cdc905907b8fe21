"""The resolved configuration of one run: which components, how long, which seed, and overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rlbench.errors import RlbenchError


@dataclass
class RunConfig:
    algo: str = "dqn"
    env: str = "CartPole-v1"
    replay: str | None = None  # None: "prioritized" for replay-loop algorithms, none for tabular ones
    compute: str = "cpu"
    transport: str = "inproc"
    placement: str = "local"
    actors: int = 1
    num_envs: int = 1
    steps: int | None = None  # None: the algorithm's own budget (its Config.total_steps)
    seconds: float | None = None  # wall-clock budget; the run stops at whichever comes first
    seed: int = 0
    dataset: int | None = None  # offline learning over a collected dataset of this many transitions
    behaviour: str = "random"  # the dataset's behaviour policy
    eval_episodes: int = 10
    on_actor_failure: str = "continue"  # or "stop": what a distributed run does when an actor dies
    hyperparameters: dict[str, Any] = field(default_factory=dict)  # overrides of the algorithm's Config
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> plugin options of the chosen component
    out: str | None = None  # directory (or .json path) for the result

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
        if isinstance(default, tuple) and isinstance(value, list):
            value = tuple(value)
        elif isinstance(default, tuple) and not isinstance(value, (list, tuple)):
            value = (value,)
        elif isinstance(default, bool) and not isinstance(value, bool):
            raise RlbenchError(f"hyperparameter {key} takes true or false, got {value!r}")
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif default is not None and not isinstance(value, type(default)) and not isinstance(default, tuple):
            raise RlbenchError(f"hyperparameter {key} takes a {type(default).__name__}, got {value!r}")
        values[key] = value
    return config_cls(**values)
