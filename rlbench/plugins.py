"""The plugin manager: loads the built-ins and every "rlbench" entry point, and builds the registry.

- Built-ins (``rlbench.builtin``) go through exactly the same hooks as third-party plugins.
- ``RLBENCH_DISABLE_PLUGINS=dpdk,fpga`` blocks plugins by entry-point name ("builtin" included).
- A plugin that fails to import, whose hook raises, or that claims a name another plugin (or the
  core) claims, is refused wholly: nothing of it is registered and none of its hooks runs. It is
  recorded in ``Registry.broken`` with why, shown by ``rlbench list``, and never takes the CLI down.
"""

from __future__ import annotations

import os
import traceback
from importlib.metadata import entry_points
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import pluggy

from rlbench import hookspecs
from rlbench.config import RUN_FLAGS
from rlbench.errors import RlbenchError
from rlbench.protocols import KINDS, RunOption
from rlbench.registry import BrokenPlugin, Component, Registry, check_component

PROJECT = "rlbench"
ENTRY_POINT_GROUP = "rlbench"
BUILTIN = "builtin"

REGISTER_HOOKS = {
    "transport": "rlbench_register_transports",
    "replay": "rlbench_register_replay_memories",
    "compute": "rlbench_register_compute_backends",
    "environment": "rlbench_register_environments",
    "algorithm": "rlbench_register_algorithms",
    "policy": "rlbench_register_policies",
}
assert set(REGISTER_HOOKS) == set(KINDS)

# What a plugin may raise at import or in a hook without taking rlbench down: anything but Ctrl-C
# (a plugin that calls sys.exit is broken, not a reason to exit).
PLUGIN_FAILURES = (Exception, SystemExit)

_registry: Registry | None = None
_manager: pluggy.PluginManager | None = None


def disabled_plugins() -> set[str]:
    raw = os.environ.get("RLBENCH_DISABLE_PLUGINS", "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def _error_line(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    return " ".join(f"{type(exc).__name__}: {exc}{where}".split())


def build(extra_plugins: Iterable[tuple[str, Any]] = (), *, load_entry_points: bool = True,
          disable: set[str] | None = None) -> tuple[Registry, pluggy.PluginManager]:
    """Build a fresh registry. `extra_plugins` are (name, plugin object) pairs, used by tests."""
    disable = disabled_plugins() if disable is None else disable
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(hookspecs)
    registry = Registry()

    candidates: list[tuple[str, Any]] = []
    if BUILTIN not in disable:
        from rlbench import builtin

        candidates.append((BUILTIN, builtin))
    if load_entry_points:
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if ep.name in disable:
                continue
            try:
                candidates.append((ep.name, ep.load()))
            except PLUGIN_FAILURES as exc:  # a broken third-party plugin must not break rlbench
                registry.broken.append(BrokenPlugin(ep.name, f"import failed: {_error_line(exc)}"))
    candidates.extend((name, obj) for name, obj in extra_plugins if name not in disable)

    declared: dict[str, Declared] = {}
    for name, plugin in candidates:
        try:
            manager.register(plugin, name=name)
            declared[name] = Declared(name)
        except PLUGIN_FAILURES as exc:
            registry.broken.append(BrokenPlugin(name, f"registration failed: {_error_line(exc)}"))

    for kind, hook_name in REGISTER_HOOKS.items():
        for impl in getattr(manager.hook, hook_name).get_hookimpls():
            _call_register_hook(declared[impl.plugin_name], impl, kind)
    for impl in manager.hook.rlbench_register_run_options.get_hookimpls():
        _call_option_hook(declared[impl.plugin_name], impl)

    claims = name_claims(declared.values())
    for plugin in declared.values():
        problems = plugin.problems + claims.get(plugin.plugin, [])
        if problems:  # refused wholly: none of its components, options or other hooks
            registry.broken.append(BrokenPlugin(plugin.plugin, "; ".join(problems)))
            manager.unregister(name=plugin.plugin)
            continue
        registry.plugins.append(plugin.plugin)
        for component in plugin.components:
            registry._add(component)
        registry.run_options.extend(plugin.options)
    return registry, manager


@dataclass
class Declared:
    """What one plugin's register hooks declared: registered all together, or not at all."""

    plugin: str
    components: list[Component] = field(default_factory=list)
    options: list[RunOption] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why it is refused whatever else is installed


def name_claims(declared: Iterable[Declared]) -> dict[str, list[str]]:
    """Plugin -> why the names it claims are not its to take. The rule (docs/plugins.md, "Names"):
    a component name (per kind, case aside) and a run-option flag each belong to one plugin. The
    core's are reserved (plugin "builtin", and `rlbench run`'s own flags); a name two other plugins
    claim is refused to both; a name NS/NAME is plugin NS's; a plugin's run options are for its own
    components. Nothing depends on the order plugins load in."""
    declared = [d for d in declared if not d.problems]  # a plugin refused anyway claims nothing
    owners: dict[tuple[str, ...], list[tuple[str, str]]] = defaultdict(list)  # claim -> [(plugin, as written)]
    for plugin in declared:
        for component in plugin.components:
            owners[("component", component.kind, component.name.lower())].append((plugin.plugin, component.name))
        for option in plugin.options:
            owners[("flag", option.flag)].append((plugin.plugin, option.flag))
    problems: dict[str, list[str]] = defaultdict(list)
    for claim, claimants in owners.items():
        for plugin, written in claimants:
            what = f"{claim[1]} {written!r}" if claim[0] == "component" else f"run option {written}"
            others = sorted({other for other, _ in claimants if other != plugin})
            if plugin == BUILTIN:
                continue
            if BUILTIN in others:
                problems[plugin].append(f"{what} is already registered by plugin {BUILTIN!r} (the core's names are "
                                        "reserved)")
            elif others:
                problems[plugin].append(f"{what} is also registered by plugin "
                                        + " and by plugin ".join(repr(o) for o in others))
            if claim[0] == "flag" and written in RUN_FLAGS:
                problems[plugin].append(f"{what} is one of `rlbench run`'s own")
            namespace = written.partition("/")[0] if claim[0] == "component" and "/" in written else plugin
            if namespace != plugin:
                problems[plugin].append(f"{what} is in the namespace of plugin {namespace!r} (a name NS/NAME "
                                        "belongs to plugin NS)")
    registered = {(c.kind, c.name): plugin.plugin for plugin in declared for c in plugin.components}
    for plugin in declared:
        for option in plugin.options:
            owner = registered.get((option.kind, option.component))
            if owner != plugin.plugin:
                problems[plugin.plugin].append(
                    f"run option {option.flag} is for {option.kind} {option.component!r}, which "
                    + (f"plugin {owner!r} registers, not this one" if owner else "this plugin does not register"))
    return {plugin: ["refused wholly (none of its components or options is registered): " + "; ".join(sorted(found))
                     + " (each name belongs to one plugin: see docs/plugins.md, \"Names\")"]
            for plugin, found in problems.items()}


def _call_register_hook(plugin: Declared, impl: Any, kind: str) -> None:
    def register(name: str, factory: Any, *, capabilities: Any, probe: Any = None, description: str = "") -> None:
        if not isinstance(name, str) or not name:
            raise RlbenchError(f"plugin {plugin.plugin!r} registered a {kind} with an empty name")
        if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
            raise RlbenchError(f"{kind} {name!r}: factory must be a callable or a 'module:attr' string")
        component = Component(kind, name, plugin.plugin, factory, capabilities, probe, description)
        check_component(component)
        if any(c.kind == kind and c.name.lower() == name.lower() for c in plugin.components):
            raise RlbenchError(f"{kind} {name!r} is registered twice")
        plugin.components.append(component)

    try:
        impl.function(register=register)
    except PLUGIN_FAILURES as exc:
        plugin.problems.append(f"{REGISTER_HOOKS[kind]} failed: {_error_line(exc)}")


def _call_option_hook(plugin: Declared, impl: Any) -> None:
    def option(kind: str, component: str, flag: str, param: str, *, type: Any = str, default: Any = None,
               help: str = "", choices: tuple[str, ...] = ()) -> None:
        if kind not in KINDS:
            raise RlbenchError(f"run option {flag}: unknown component kind {kind!r}; kinds: {', '.join(KINDS)}")
        if not isinstance(flag, str) or not flag.startswith("--") or len(flag) < 3 or " " in flag or "=" in flag:
            raise RlbenchError(f"run option {flag!r} must look like '--name'")
        if any(o.flag == flag for o in plugin.options):
            raise RlbenchError(f"run option {flag} is defined twice")
        plugin.options.append(RunOption(kind, component, flag, param, type, default, help, plugin.plugin,
                                        tuple(choices)))

    try:
        impl.function(option=option)
    except PLUGIN_FAILURES as exc:
        plugin.problems.append(f"rlbench_register_run_options failed: {_error_line(exc)}")


def get_registry(*, refresh: bool = False) -> Registry:
    """The process-wide registry (built on first use)."""
    global _registry, _manager
    if _registry is None or refresh:
        _registry, _manager = build()
    return _registry


def get_manager() -> pluggy.PluginManager:
    get_registry()
    assert _manager is not None
    return _manager


def call_hook_safely(hook_name: str, **kwargs: Any) -> list[tuple[str, Any]]:
    """Call a non-register hook on every plugin, one by one, so one failing plugin is reported
    (as an ``{"error": ...}`` entry) instead of stopping the others or the run."""
    results = []
    for impl in getattr(get_manager().hook, hook_name).get_hookimpls():
        try:
            results.append((impl.plugin_name, impl.function(**kwargs)))
        except PLUGIN_FAILURES as exc:
            results.append((impl.plugin_name, {"error": _error_line(exc)}))
    return results

