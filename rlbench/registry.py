"""The registry: every component by kind and name, with lazy factories and probes.

Plugins never touch it directly: the plugin manager hands each plugin a `register` callback bound
to the plugin's name and kind (the tox / llm pattern), and only the manager builds the registry.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from rlbench.errors import RlbenchError, UnavailableComponentError, UnknownComponentError
from rlbench.protocols import CAPABILITY_TYPES, KINDS, Probe, RunOption

KIND_FLAGS = {
    "transport": "--transport",
    "replay": "--replay",
    "compute": "--compute",
    "environment": "--env",
    "algorithm": "--algo",
    "policy": "--policy",
}


def normalised(name: str) -> str:
    """A name as the namespace compares it: case and '-'/'_' aside (`--zmq_port` is `--zmq-port`,
    `ZMQ` is `zmq`). Component names, run-option flags, commands and plugin names alike."""
    return name.lower().replace("_", "-")


def load_object(target: str) -> Any:
    """Import "package.module:attr.sub" and return the attribute."""
    module_name, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"lazy reference {target!r} must look like 'module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class Component:
    kind: str
    name: str
    plugin: str
    factory: Callable[..., Any] | str
    capabilities: Any
    probe_fn: Callable[[], Probe] | str | None = None
    description: str = ""
    _probe: Probe | None = field(default=None, repr=False)

    def probe(self) -> Probe:
        """Cached; a probe that raises makes the component unavailable with the error as reason."""
        if self._probe is None:
            if self.probe_fn is None:
                self._probe = Probe.ok()
            else:
                try:
                    fn = load_object(self.probe_fn) if isinstance(self.probe_fn, str) else self.probe_fn
                    result = fn()
                    self._probe = result if isinstance(result, Probe) else Probe(bool(result), "")
                except Exception as exc:  # a broken probe must not break `rlbench list`
                    self._probe = Probe.missing(f"probe failed: {type(exc).__name__}: {exc}")
        return self._probe

    def load(self) -> Callable[..., Any]:
        return load_object(self.factory) if isinstance(self.factory, str) else self.factory

    def create(self, **kwargs: Any) -> Any:
        """Build the component; refuses with the probe's reason when it cannot run here."""
        probe = self.probe()
        if not probe.available:
            raise UnavailableComponentError(f"{self.kind} {self.name!r} (plugin {self.plugin}) is unavailable: {probe.reason}")
        return self.load()(**kwargs)


def check_component(component: Component) -> None:
    """Refuse a registration that cannot be right whatever else is installed."""
    if component.kind not in CAPABILITY_TYPES:
        raise RlbenchError(f"unknown component kind {component.kind!r}")
    expected = CAPABILITY_TYPES[component.kind]
    if not isinstance(component.capabilities, expected):
        raise RlbenchError(
            f"{component.kind} {component.name!r}: capabilities must be a {expected.__name__}, "
            f"got {type(component.capabilities).__name__}")


@dataclass
class BrokenPlugin:
    name: str
    error: str


@dataclass
class PluginCommand:
    """A CLI command a plugin adds: `path` is its name under `rlbench` ("upmem", "bench dpdk")."""

    plugin: str
    path: str
    command: Any  # a click.Command


class Registry:
    """Read-only view for everyone but the plugin manager."""

    def __init__(self) -> None:
        self._components: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}
        self.broken: list[BrokenPlugin] = []
        self.plugins: list[str] = []
        self.run_options: list[RunOption] = []
        self.commands: list[PluginCommand] = []
        self.targets: dict[str, str] = {}  # loaded plugin -> the plugin API it targets (rlbench.kit.api)
        self.deprecations: list[tuple[str, str]] = []  # (plugin, what it does that a later plugin API refuses)
        self._manager: Any = None  # the pluggy manager whose hooks these plugins are (rlbench.plugins)

    # -- building (plugin manager only) --------------------------------------------------------
    def _add(self, component: Component) -> None:
        """Called with checked components whose names no other plugin claims (rlbench.plugins)."""
        assert component.name not in self._components[component.kind], f"{component.kind} {component.name!r} twice"
        self._components[component.kind][component.name] = component

    def _remove(self, plugin: str, reason: str) -> None:
        """Called by rlbench.plugins.refuse: nothing of `plugin` is left, and `broken` says why."""
        for kind in KINDS:
            self._components[kind] = {n: c for n, c in self._components[kind].items() if c.plugin != plugin}
        self.run_options = [o for o in self.run_options if o.plugin != plugin]
        self.commands = [c for c in self.commands if c.plugin != plugin]
        self.deprecations = [d for d in self.deprecations if d[0] != plugin]
        self.plugins = [p for p in self.plugins if p != plugin]
        self.targets.pop(plugin, None)
        self.broken.append(BrokenPlugin(plugin, reason))

    # -- reading -------------------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        return list(self._components[kind])

    def components(self, kind: str | None = None) -> Iterable[Component]:
        kinds = KINDS if kind is None else (kind,)
        for k in kinds:
            yield from self._components[k].values()

    def get(self, kind: str, name: str) -> Component:
        try:
            return self._components[kind][name]
        except KeyError:
            pass
        # A match case and '-'/'_' aside is the same name (one namespace), not a guess; accept it.
        for candidate, component in self._components[kind].items():
            if normalised(candidate) == normalised(name):
                return component
        raise UnknownComponentError(self._unknown_message(kind, name))

    def _unknown_message(self, kind: str, name: str) -> str:
        names = self.names(kind)
        lowered = {n.lower(): n for n in names}
        close = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.5)
        flag = KIND_FLAGS[kind]
        message = f"unknown {kind} {name!r} for {flag}"
        if close:
            message += "; did you mean " + " or ".join(repr(lowered[c]) for c in close) + "?"
        else:
            message += f"; known: {', '.join(sorted(names)) or 'none'}"
        broken = [b.name for b in self.broken]
        if broken:
            message += f" (plugins that failed to load: {', '.join(broken)}; see `rlbench list`)"
        return message

    def options_for(self, kind: str, component: str) -> list[RunOption]:
        return [o for o in self.run_options if o.kind == kind and o.component == component]
