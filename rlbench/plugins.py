"""The plugin manager: loads the built-ins and every "rlbench" entry point, and builds the registry.

- Built-ins (``rlbench.builtin``) go through exactly the same hooks as third-party plugins.
- ``RLBENCH_DISABLE_PLUGINS=dpdk,fpga`` blocks plugins by entry-point name ("builtin" included).
- A plugin that fails to import, that targets a plugin API this rlbench does not serve
  (``RLBENCH_API``, rlbench.kit.api), whose hook raises, or that claims a name another plugin (or the
  core) claims, is refused wholly: nothing of it is registered and none of its hooks runs again. It
  is recorded in ``Registry.broken`` with why, shown by ``rlbench list``, and never takes the CLI down.
- Every hook that needs no run is called while the registry is built (register hooks, run options,
  commands), except ``rlbench_fingerprint``, which may import a device's driver: it is called when a
  fingerprint is wanted (``rlbench list``, ``rlbench info``, before each run), and a plugin whose
  fingerprint raises is refused wholly from then on.
"""

from __future__ import annotations

import importlib
import os
import traceback
from importlib.metadata import entry_points
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pluggy

from rlbench import hookspecs
from rlbench.config import CORE_COMMANDS, RUN_FLAGS
from rlbench.errors import RlbenchError
from rlbench.kit import api
from rlbench.protocols import KINDS, RunOption
from rlbench.registry import BrokenPlugin, Component, PluginCommand, Registry, check_component, normalised

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
    """Build a fresh registry. `extra_plugins` are (name, plugin object) pairs, used by tests; one stands
    in for an installed entry point of the same name (rlbench.testing.registered)."""
    extra_plugins = list(extra_plugins)
    extra_names = {normalised(name) for name, _ in extra_plugins}
    disable = {normalised(name) for name in (disabled_plugins() if disable is None else disable)}
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(hookspecs)
    registry = Registry()
    registry._manager = manager

    offered: list[Offered] = []
    if BUILTIN not in disable:
        offered.append(Offered(BUILTIN, "rlbench itself", lambda: importlib.import_module("rlbench.builtin")))
    if load_entry_points:
        offered += [Offered(ep.name, f"distribution {ep.dist.name if ep.dist else ep.value!r}", ep.load)
                    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
                    if normalised(ep.name) not in extra_names]
    offered += [Offered(name, "the caller", lambda obj=obj: obj) for name, obj in extra_plugins]
    offered = [o for o in offered if normalised(o.name) not in disable]

    declared: dict[str, Declared] = {}
    for candidate in _one_plugin_per_name(offered, registry):
        name = candidate.name
        try:
            plugin = candidate.load()
        except PLUGIN_FAILURES as exc:  # a broken third-party plugin must not break rlbench
            registry.broken.append(BrokenPlugin(name, f"import failed: {_error_line(exc)}"))
            continue
        target = getattr(plugin, api.DECLARATION, None)
        refusal = None if target is None else api.incompatibility(target)
        if refusal:
            registry.broken.append(BrokenPlugin(name, f"refused: {refusal}"))
            continue
        try:
            manager.register(plugin, name=name)
            declared[name] = Declared(name, target)
        except PLUGIN_FAILURES as exc:
            registry.broken.append(BrokenPlugin(name, f"registration failed: {_error_line(exc)}"))

    for kind, hook_name in REGISTER_HOOKS.items():
        for impl in getattr(manager.hook, hook_name).get_hookimpls():
            _call_register_hook(declared[impl.plugin_name], impl, kind)
    for impl in manager.hook.rlbench_register_run_options.get_hookimpls():
        _call_option_hook(declared[impl.plugin_name], impl)
    for impl in manager.hook.rlbench_register_commands.get_hookimpls():
        _call_commands_hook(declared[impl.plugin_name], impl)
    for plugin in declared.values():
        _check_flag_prefixes(plugin)

    claims = name_claims(declared.values())
    for plugin in declared.values():
        problems = plugin.problems + claims.get(plugin.plugin, [])
        if problems:  # refused wholly: none of its components, options, commands or other hooks
            registry.broken.append(BrokenPlugin(plugin.plugin, "; ".join(problems)))
            manager.unregister(name=plugin.plugin)
            continue
        registry.plugins.append(plugin.plugin)
        registry.targets[plugin.plugin] = plugin.target or api.UNVERSIONED
        for component in plugin.components:
            registry._add(component)
        registry.run_options.extend(plugin.options)
        registry.commands.extend(plugin.commands)
        for message in plugin.deprecations:
            registry.deprecations.append((plugin.plugin, message))
            api.warn(f"plugin {plugin.plugin!r}: {message}")
    return registry, manager


@dataclass
class Offered:
    """A plugin on offer: its name (an entry point's), where it comes from, and how to import it."""

    name: str
    source: str
    load: Callable[[], Any]


def _one_plugin_per_name(offered: list[Offered], registry: Registry) -> list[Offered]:
    """A plugin name (case and '-'/'_' aside) is one plugin's: two distributions offering one entry-point
    name are both refused, before either is imported (whichever was found first would win otherwise);
    "builtin" is rlbench's own."""
    by_name: dict[str, list[Offered]] = defaultdict(list)
    for candidate in offered:
        by_name[normalised(candidate.name)].append(candidate)
    kept = []
    for same in by_name.values():
        if len(same) == 1:
            kept.append(same[0])
            continue
        ours = [c for c in same if c.source == "rlbench itself"]
        kept += ours
        for candidate in same:
            if candidate in ours:
                continue
            others = " and by ".join(o.source for o in same if o is not candidate)
            registry.broken.append(BrokenPlugin(candidate.name, (
                f"refused: entry point {candidate.name!r} of {candidate.source} is also provided by {others} "
                "(a plugin name is one plugin's, case and '-'/'_' aside: uninstall one of them"
                + (", or rename it: 'builtin' is rlbench's own)" if ours else ")"))))
    return kept


@dataclass
class Declared:
    """What one plugin's hooks declared: registered all together, or not at all."""

    plugin: str
    target: str | None = None  # the plugin API it declares it targets (RLBENCH_API), None: undeclared
    components: list[Component] = field(default_factory=list)
    options: list[RunOption] = field(default_factory=list)
    commands: list[PluginCommand] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why it is refused whatever else is installed
    deprecations: list[str] = field(default_factory=list)  # what it may do until plugin API REMOVED_IN


def name_claims(declared: Iterable[Declared]) -> dict[str, list[str]]:
    """Plugin -> why the names it claims are not its to take. The rule (docs/plugins.md, "Names"):
    a component name (per kind), a run-option flag and a command each belong to one plugin, compared
    case and '-'/'_' aside (`--zmq_port` is `--zmq-port`). The core's are reserved (plugin "builtin",
    `rlbench run`'s own flags and rlbench's own commands); a name two other plugins claim is refused
    to both; a name NS/NAME is plugin NS's; a plugin's run options are for its own components.
    Nothing depends on the order plugins load in."""
    declared = [d for d in declared if not d.problems]  # a plugin refused anyway claims nothing
    owners: dict[tuple[str, ...], list[tuple[str, str]]] = defaultdict(list)  # claim -> [(plugin, as written)]
    for plugin in declared:
        for component in plugin.components:
            owners[("component", component.kind, normalised(component.name))].append((plugin.plugin, component.name))
        for option in plugin.options:
            owners[("flag", normalised(option.flag))].append((plugin.plugin, option.flag))
        for command in plugin.commands:
            owners[("command", normalised(command.path))].append((plugin.plugin, command.path))
    core_flags = {normalised(flag): flag for flag in RUN_FLAGS}
    core_commands = {normalised(path): path for path in CORE_COMMANDS}
    problems: dict[str, list[str]] = defaultdict(list)
    for claim, claimants in owners.items():
        for plugin, written in claimants:
            what = {"component": f"{claim[1]} {written!r}", "flag": f"run option {written}",
                    "command": f"command `rlbench {written}`"}[claim[0]]
            others = sorted({(other, spelt) for other, spelt in claimants if other != plugin})
            if plugin == BUILTIN:
                continue
            if any(other == BUILTIN for other, _ in others):
                problems[plugin].append(f"{what} is already registered by plugin {BUILTIN!r} (the core's names are "
                                        "reserved)")
            elif others:
                problems[plugin].append(f"{what} is also registered by " + " and by ".join(
                    f"plugin {other!r}" + (f" as {spelt}" if spelt != written else "") for other, spelt in others)
                    + (" (one name, case and '-'/'_' aside)" if any(s != written for _, s in others) else ""))
            if claim[0] == "flag" and claim[1] in core_flags:
                spelt = core_flags[claim[1]]
                problems[plugin].append(f"{what} is one of `rlbench run`'s own" + (f" ({spelt})" if spelt != written
                                                                                    else ""))
            if claim[0] == "command" and claim[1] in core_commands:
                problems[plugin].append(f"{what} is one of rlbench's own (a plugin adds commands, it never replaces "
                                        "one)")
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
    return {plugin: ["refused wholly (none of its components, options or commands is registered): "
                     + "; ".join(sorted(found)) + " (each name belongs to one plugin: see docs/plugins.md, \"Names\")"]
            for plugin, found in problems.items()}


FLAG_PREFIX_SINCE = "1.1"  # the plugin API that made `--<plugin>-` / `--<component>-` flags the rule


def _check_flag_prefixes(plugin: Declared) -> None:
    """A run-option flag says whose it is: `--<plugin>-<param>` or `--<component>-<param>` (an unprefixed
    `--partition` of one plugin refuses every other plugin that wants one). Deprecated for plugins
    that target plugin API 1.0, refused for those that target 1.1 or later (the built-in plugins do)."""
    for option in plugin.options:
        prefixes = sorted({f"--{normalised(plugin.plugin)}-", f"--{normalised(option.component)}-"})
        if normalised(option.flag).startswith(tuple(prefixes)):
            continue
        message, refused = api.deprecation(
            f"run option {option.flag} does not start with " + " or ".join(prefixes) + " (name a flag "
            f"{prefixes[0]}<param>: flags are one namespace for every plugin)", target=plugin.target,
            since=FLAG_PREFIX_SINCE)
        (plugin.problems if refused else plugin.deprecations).append(message)


def _call_register_hook(plugin: Declared, impl: Any, kind: str) -> None:
    def register(name: str, factory: Any, *, capabilities: Any, probe: Any = None, description: str = "") -> None:
        if not isinstance(name, str) or not name:
            raise RlbenchError(f"plugin {plugin.plugin!r} registered a {kind} with an empty name")
        if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
            raise RlbenchError(f"{kind} {name!r}: factory must be a callable or a 'module:attr' string")
        component = Component(kind, name, plugin.plugin, factory, capabilities, probe, description)
        check_component(component)
        if any(c.kind == kind and normalised(c.name) == normalised(name) for c in plugin.components):
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
        twice = [o.flag for o in plugin.options if normalised(o.flag) == normalised(flag)]
        if twice:
            raise RlbenchError(f"run option {flag} is defined twice"
                               + (f" (as {twice[0]})" if twice[0] != flag else ""))
        plugin.options.append(RunOption(kind, component, flag, param, type, default, help, plugin.plugin,
                                        tuple(choices)))

    try:
        impl.function(option=option)
    except PLUGIN_FAILURES as exc:
        plugin.problems.append(f"rlbench_register_run_options failed: {_error_line(exc)}")


def _call_commands_hook(plugin: Declared, impl: Any) -> None:
    """Calls the hook with a stand-in of the root group that holds the core's commands (placeholders),
    so what the plugin adds is known, and checked, before the CLI exists: replacing a command is seen
    as a claim of its name."""
    import click

    root = click.Group("rlbench")
    core: dict[str, Any] = {}
    for path in sorted(CORE_COMMANDS, key=len):
        group, _, name = path.rpartition(" ")
        command = click.Group(name) if name == "bench" else click.Command(name)
        (root.commands[group] if group else root).add_command(command)
        core[path] = command
    try:
        impl.function(cli=root)
    except PLUGIN_FAILURES as exc:
        plugin.problems.append(f"rlbench_register_commands failed: {_error_line(exc)}")
        return
    added = [(name, command) for name, command in root.commands.items()]
    bench = root.commands.get("bench")
    if isinstance(bench, click.Group):
        added += [(f"bench {name}", command) for name, command in bench.commands.items()]
    plugin.commands += [PluginCommand(plugin.plugin, path, command) for path, command in added
                        if core.get(path) is not command]


def refuse(registry: Registry, plugin: str, reason: str) -> None:
    """Refuse a loaded plugin wholly from now on (a hook called after the build raised): its components,
    options and commands leave the registry and none of its hooks runs again."""
    registry._remove(plugin, reason)
    if registry._manager is not None and registry._manager.has_plugin(plugin):
        registry._manager.unregister(name=plugin)


def plugin_fingerprints(registry: Registry | None = None) -> dict[str, Any]:
    """Each loaded plugin's `rlbench_fingerprint` (None left out); a plugin whose fingerprint raises is
    refused wholly (`refuse`), so nothing of it runs without its description of the machine."""
    registry = registry or get_registry()
    found: dict[str, Any] = {}
    for impl in registry._manager.hook.rlbench_fingerprint.get_hookimpls():
        try:
            data = impl.function()
        except PLUGIN_FAILURES as exc:
            refuse(registry, impl.plugin_name, f"rlbench_fingerprint failed: {_error_line(exc)}")
            continue
        if data is not None:
            found[impl.plugin_name] = data
    return found


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

