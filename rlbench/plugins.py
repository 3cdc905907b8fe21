"""The plugin manager: loads the built-ins and every "rlbench" entry point, and builds the registry.

- Built-ins (``rlbench.builtin``) go through exactly the same hooks as third-party plugins.
- ``RLBENCH_DISABLE_PLUGINS=dpdk,fpga`` blocks plugins by entry-point name ("builtin" included).
- A plugin that fails to import, or whose hook raises, is recorded in ``Registry.broken`` with its
  error and shown by ``rlbench list``; it never takes the CLI down.
"""

from __future__ import annotations

import os
import traceback
from importlib.metadata import entry_points
from typing import Any, Iterable

import pluggy

from rlbench import hookspecs
from rlbench.errors import RlbenchError
from rlbench.protocols import KINDS, RunOption
from rlbench.registry import BrokenPlugin, Component, Registry

PROJECT = "rlbench"
ENTRY_POINT_GROUP = "rlbench"
BUILTIN = "builtin"

REGISTER_HOOKS = {
    "transport": "rlbench_register_transports",
    "replay": "rlbench_register_replay_memories",
    "compute": "rlbench_register_compute_backends",
    "environment": "rlbench_register_environments",
    "algorithm": "rlbench_register_algorithms",
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

    for name, plugin in candidates:
        try:
            manager.register(plugin, name=name)
            registry.plugins.append(name)
        except PLUGIN_FAILURES as exc:
            registry.broken.append(BrokenPlugin(name, f"registration failed: {_error_line(exc)}"))

    for kind, hook_name in REGISTER_HOOKS.items():
        hook = getattr(manager.hook, hook_name)
        for impl in hook.get_hookimpls():  # registration order: built-ins first, so they keep their names
            _call_register_hook(registry, impl, kind)

    for impl in manager.hook.rlbench_register_run_options.get_hookimpls():
        _call_option_hook(registry, impl)
    return registry, manager


def _mark_broken(registry: Registry, plugin: str, error: str) -> None:
    if not any(b.name == plugin and b.error == error for b in registry.broken):
        registry.broken.append(BrokenPlugin(plugin, error))


def _call_register_hook(registry: Registry, impl: Any, kind: str) -> None:
    plugin_name = impl.plugin_name

    def register(name: str, factory: Any, *, capabilities: Any, probe: Any = None, description: str = "") -> None:
        if not isinstance(name, str) or not name:
            raise RlbenchError(f"plugin {plugin_name!r} registered a {kind} with an empty name")
        if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
            raise RlbenchError(f"{kind} {name!r}: factory must be a callable or a 'module:attr' string")
        registry._add(Component(kind, name, plugin_name, factory, capabilities, probe, description))

    try:
        impl.function(register=register)
    except PLUGIN_FAILURES as exc:
        _mark_broken(registry, plugin_name, f"{REGISTER_HOOKS[kind]} failed: {_error_line(exc)}")


def _call_option_hook(registry: Registry, impl: Any) -> None:
    plugin_name = impl.plugin_name

    def option(kind: str, component: str, flag: str, param: str, *, type: Any = str, default: Any = None,
               help: str = "", choices: tuple[str, ...] = ()) -> None:
        if not flag.startswith("--"):
            raise RlbenchError(f"run option {flag!r} must start with '--'")
        taken = {o.flag for o in registry.run_options}
        if flag in taken:
            raise RlbenchError(f"run option {flag} is already defined by another plugin")
        registry.run_options.append(RunOption(kind, component, flag, param, type, default, help, plugin_name,
                                              tuple(choices)))

    try:
        impl.function(option=option)
    except PLUGIN_FAILURES as exc:
        _mark_broken(registry, plugin_name, f"rlbench_register_run_options failed: {_error_line(exc)}")


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

