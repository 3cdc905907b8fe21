"""Hook specifications for rlbench plugins (pluggy project "rlbench", entry-point group "rlbench").

A plugin is a module (or object) with functions marked ``@rlbench.hookimpl`` and named as below,
exposed through an entry point in the "rlbench" group::

    [project.entry-points.rlbench]
    dpdk = "rlbench_dpdk.plugin"

Register hooks receive a ``register`` callback; plugins never touch the registry. Factories and
probes may be callables or lazy ``"module:attr"`` strings; a plugin module itself must be cheap to
import (no torch, pyopencl or DPDK at import time), because ``rlbench list`` imports every plugin.

Names belong to one plugin and are compared case and '-'/'_' aside: a component name (per kind), a
run-option flag or a command that the core or another plugin also registers, a name ``NS/NAME``
outside the plugin's own namespace, or an option for another plugin's component refuses the plugin
wholly (every plugin in a clash alike), as does a hook that raises; ``rlbench list`` says why
(docs/plugins.md, "Names"). A plugin module declares the plugin API it targets, ``RLBENCH_API =
"1.1"`` (rlbench.kit.api; docs/plugin-api-changelog.md).
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("rlbench")
hookimpl = pluggy.HookimplMarker("rlbench")


@hookspec
def rlbench_register_transports(register: Any) -> None:
    """Register message transports.

    :param register: ``register(name, factory, *, capabilities, probe=None, description="")``.
        ``factory(**options)`` returns an object satisfying :class:`rlbench.protocols.Transport`
        (it takes ``max_message_bytes=``, refuses unknown options, and listens at
        ``NAME://HOST:0`` under ``--bind`` and cluster launchers unless it defines ``listen_address``);
        ``capabilities`` is a :class:`rlbench.protocols.TransportCapabilities`; ``probe()`` returns a
        :class:`rlbench.protocols.Probe` saying whether the transport can run here and, if not, why.
    """


@hookspec
def rlbench_register_replay_memories(register: Any) -> None:
    """Register replay memories.

    :param register: as for transports; ``factory(capacity, *, alpha, seed, **options)`` returns a
        :class:`rlbench.protocols.ReplayMemory`; capabilities: :class:`ReplayCapabilities`.
    """


@hookspec
def rlbench_register_compute_backends(register: Any) -> None:
    """Register compute backends (where actor inference, learner updates and tabular updates run).

    :param register: as for transports; ``factory(**options)`` returns a
        :class:`rlbench.protocols.ComputeBackend`; capabilities: :class:`ComputeCapabilities`, whose
        ``roles`` name the ``"<algorithm>:<role>"`` pairs it runs.
    """


@hookspec
def rlbench_register_environments(register: Any) -> None:
    """Register environments.

    :param register: as for transports; ``factory(num_envs, *, seed, **options)`` returns a
        :class:`rlbench.protocols.Environment`; capabilities: :class:`EnvironmentCapabilities`.
    """


@hookspec
def rlbench_register_algorithms(register: Any) -> None:
    """Register algorithms.

    :param register: as for transports; ``factory()`` returns a :class:`rlbench.protocols.Algorithm`;
        capabilities: :class:`AlgorithmCapabilities` (action/observation spaces, which runtime loop).
    """


@hookspec
def rlbench_register_policies(register: Any) -> None:
    """Register distribution policies (MSRL): where the parts of a run execute, e.g. one learner fed
    by actors, several learners averaging gradients, or everything in one process.

    :param register: as for transports; ``factory()`` returns a
        :class:`rlbench.protocols.DistributionPolicy`; capabilities: :class:`PolicyCapabilities`.
        ``rlbench.testing.check_policy`` checks one.
    """


@hookspec
def rlbench_register_run_options(option: Any) -> None:
    """Add command-line options to ``rlbench run`` for one of the plugin's components.

    :param option: ``option(kind, component, flag, param, *, type=str, default=None, help="",
        choices=())``, for one of the plugin's own components; name the flag ``--<plugin>-<param>``
        or ``--<component>-<param>`` (flags are one namespace, ``rlbench run``'s own are reserved;
        an unprefixed flag is refused for plugins that target plugin API 1.1, deprecated for 1.0).
        When the user selects that component, the option's value reaches its factory as keyword
        ``param``; setting the option while another component is selected is refused.
    """


@hookspec
def rlbench_register_commands(cli: Any) -> None:
    """Add CLI commands.

    :param cli: the root ``click.Group``; add commands or groups to it (e.g. ``rlbench dpdk doctor``),
        or to its ``bench`` group (``cli.commands["bench"]``). Called when the registry is built, on
        a stand-in that holds rlbench's own commands: replacing one of them, or adding a command
        another plugin adds, refuses the plugin wholly, as does raising.
    """


@hookspec
def rlbench_fingerprint() -> dict[str, Any] | None:
    """Describe what this plugin sees on the machine, for ``rlbench info`` and every result.

    :return: a JSON-serialisable dict (versions, devices, ports...), or None. Keep it cheap. Called
        by ``rlbench list``, ``rlbench info`` and before each run; raising refuses the plugin wholly.
    """


@hookspec
def rlbench_energy_meters(config: Any) -> list[Any] | None:
    """Energy meters for a run, started before training and stopped after it.

    :param config: the :class:`rlbench.config.RunConfig` about to run (return nothing if it does
        not concern your hardware).
    :return: meters, each with ``name`` (its key in ``result["energy"]``), ``start()`` and
        ``stop() -> {"kind": "measured" | "modelled" | None, "joules": float | None, "source": str,
        "reason": str (when joules is None)}``, and optionally ``close()``. Never report a made-up
        measured figure: no counter, no ``"measured"``.
    """


@hookspec
def rlbench_run_configured(config: Any) -> None:
    """Called once a run's configuration is resolved and validated, before any component starts.

    :param config: the :class:`rlbench.config.RunConfig` about to run (read it, do not change it).
    """


@hookspec
def rlbench_run_finished(result: dict[str, Any], path: str | None) -> None:
    """Called after a run ended (completed or not) with its result, e.g. to export it elsewhere.

    :param result: the result document (schema ``rlbench.result/1``).
    :param path: where it was written, or None when it was not written to a file.
    """
