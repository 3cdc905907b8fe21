"""The `rlbench` command line. Every error a user can cause is one line and exit code 2."""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any

import click
from click.core import ParameterSource

from rlbench.errors import RlbenchError, SignalInterrupt
from rlbench.protocols import KINDS, LAUNCHERS, PLACEMENTS

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def _registry():
    from rlbench.plugins import get_registry

    return get_registry()


def _emit_json(data: Any) -> None:
    from rlbench.results import _clean

    click.echo(json.dumps(_clean(data), indent=2))


class _Root(click.Group):
    """Builds `run` and plugin commands on first use, so `rlbench --help` sees them too."""

    _loaded = False

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        self.add_command(_run_command())
        # what the plugins' commands hooks added, checked when the registry was built (a plugin
        # whose hook raised, or that would replace a command, is refused wholly)
        for added in _registry().commands:
            group, _, name = added.path.rpartition(" ")
            (self.commands[group] if group else self).add_command(added.command, name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands:
            self._load()
        return super().get_command(ctx, name)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        self._load()
        name = args[0] if args else None
        if name is not None and name not in self.commands and not name.startswith("-"):
            import difflib

            close = difflib.get_close_matches(name, list(self.commands), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            ctx.fail(f"no such command {name!r}{hint}")
        return super().resolve_command(ctx, args)


@click.group(cls=_Root, context_settings=CONTEXT)
@click.version_option(package_name="rlbench")
def cli() -> None:
    """Benchmark distributed reinforcement learning with pluggable transports, replay memories,
    compute backends and environments."""


# ---------------------------------------------------------------------------------------------- list
@cli.command("list")
@click.option("--kind", type=click.Choice(KINDS), help="Only this kind of component.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def list_components(kind: str | None, as_json: bool) -> None:
    """Every component: kind, name, plugin, available here, and why not."""
    from rlbench.plugins import plugin_fingerprints

    registry = _registry()
    plugin_fingerprints(registry)  # a plugin whose fingerprint raises is refused, and listed so
    rows = []
    for component in registry.components(kind):
        probe = component.probe()
        rows.append({"kind": component.kind, "name": component.name, "plugin": component.plugin,
                     "available": probe.available, "reason": probe.reason, "description": component.description})
    broken = [{"plugin": b.name, "error": b.error} for b in registry.broken]
    deprecated = [{"plugin": plugin, "warning": message} for plugin, message in registry.deprecations]
    if as_json:
        _emit_json({"components": rows, "broken_plugins": broken, "deprecations": deprecated})
        return
    widths = {k: max([len(k)] + [len(str(r[k])) for r in rows]) for k in ("kind", "name", "plugin")}
    click.echo(f"{'KIND':<{widths['kind']}}  {'NAME':<{widths['name']}}  {'PLUGIN':<{widths['plugin']}}  AVAILABLE  WHY NOT / WHAT")
    for r in rows:
        detail = r["reason"] if not r["available"] else r["description"]
        click.echo(f"{r['kind']:<{widths['kind']}}  {r['name']:<{widths['name']}}  {r['plugin']:<{widths['plugin']}}  "
                   f"{'yes' if r['available'] else 'no ':<9}  {detail}")
    for b in broken:
        click.echo(f"plugin {b['plugin']!r} failed to load and is unavailable: {b['error']}")
    for d in deprecated:
        click.echo(f"plugin {d['plugin']!r} (loaded) relies on deprecated behaviour: {d['warning']}")


# ---------------------------------------------------------------------------------------------- info
@cli.command()
def info() -> None:
    """Machine fingerprint as JSON (CPU, cores, memory, versions, each plugin's own)."""
    from rlbench.fingerprint import machine_fingerprint

    _emit_json(machine_fingerprint())


# ---------------------------------------------------------------------------------------------- show
@cli.command()
@click.argument("result_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the whole document.")
def show(result_file: str, as_json: bool) -> None:
    """Print a result JSON readably."""
    from rlbench.results import load, render

    data = load(result_file)
    if as_json:
        _emit_json(data)
    else:
        data.setdefault("path", result_file)
        click.echo(render(data))


# ----------------------------------------------------------------------------------------------- run
class _Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal)."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def __call__(self, step: int, total: int) -> None:
        if not self.enabled:
            return
        fraction = min(1.0, step / max(1, total))
        elapsed = time.perf_counter() - self.t0
        bar = "#" * int(fraction * 30)
        rate = step / elapsed if elapsed > 0 else 0.0
        sys.stderr.write(f"\r[{bar:<30}] {fraction:5.1%}  {step:,}/{total:,} steps  {rate:,.0f}/s  {elapsed:5.1f}s ")
        if fraction >= 1.0:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _parse_hyperparameters(values: tuple[str, ...]) -> dict[str, Any]:
    from rlbench.config import parse_value

    parsed = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--hp")
        parsed[key.strip()] = parse_value(raw)
    return parsed


EXIT_COMPLETE, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def exit_code(result: dict[str, Any]) -> int:
    """0 complete; 128 + the signal when a signal stopped it (130 for Ctrl-C, 143 for SIGTERM);
    1 when it stopped early for any other reason (a role failed, the replay node was lost)."""
    if result["status"] == "complete":
        return EXIT_COMPLETE
    return 128 + result["stop_signal"] if result.get("stop_signal") else EXIT_FAILED


RUN_FIELDS = ("algo", "env", "replay", "compute", "transport", "placement", "policy", "learners", "actors", "replay_shards", "num_envs", "steps", "seconds",
              "seed", "dataset", "behaviour", "eval_episodes", "eval_every", "on_actor_failure", "actor_restarts", "checkpoint_every", "checkpoint_dir", "launcher", "ray_address", "bind")
RUN_FIELDS += ("placement_strategy",)  # --launcher ray's placement group
RUN_FIELDS += ("actor_compute",)  # the actors' backend, where it is not --compute's


def _run_command() -> click.Command:
    """`run`, with the options plugins contributed for their components. Defaults are RunConfig's."""
    from rlbench.config import RunConfig

    default = RunConfig()
    params = [
        click.Option(["--config", "config_file"], type=click.Path(dir_okay=False), default=None,
                     help="Read the run from a TOML run file; options given here override it."),
        click.Option(["--plan", "plan_file"], type=click.Path(dir_okay=False), default=None,
                     help="Run the plan `rlbench plan` wrote (a run file), unchanged."),
        click.Option(["--algo"], default=default.algo, show_default=True, help="Algorithm."),
        click.Option(["--env"], default=default.env, show_default=True, help="Environment id."),
        click.Option(["--replay"], default=default.replay, help="Replay memory [default: prioritized for replay-based algorithms]."),
        click.Option(["--compute"], default=default.compute, show_default=True,
                     help="Compute backend (the learner's, and the actors' unless --actor-compute is given)."),
        click.Option(["--actor-compute"], default=default.actor_compute, metavar="NAME",
                     help="Compute backend of the actors' policy inference (--placement server or in-network), e.g. "
                          "--compute gpu --actor-compute cpu: a learner on the card, actors on CPUs (EMC2'20) "
                          "[default: --compute]."),
        click.Option(["--transport"], default=default.transport, show_default=True,
                     help="Transport between roles (not for --placement local)."),
        click.Option(["--placement"], type=click.Choice(PLACEMENTS), default=None,
                     help="Where the replay memory lives [default: server when --transport is given, else local]."),
        click.Option(["--policy"], default=default.policy, show_default=True,
                     help="Distribution policy (MSRL): single-learner, data-parallel (several learners averaging "
                          "gradients; implies --placement server), device (one process); rlbench list --kind policy."),
        click.Option(["--learners"], type=int, default=default.learners, show_default=True,
                     help="Learner processes (--policy data-parallel); the global batch is split between them."),
        click.Option(["--actors"], type=int, default=default.actors, show_default=True, help="Actor processes."),
        click.Option(["--replay-shards"], type=int, default=default.replay_shards, show_default=True, metavar="N",
                     help="Replay nodes (--placement server): actor i inserts into shard i mod N; the learner draws "
                          "each batch across shards by their priority mass, so the sampling law is one memory's."),
        click.Option(["--num-envs"], type=int, default=default.num_envs, show_default=True, help="Environments per actor."),
        click.Option(["--steps"], type=int, default=default.steps, help="Env-step budget [default: the algorithm's]."),
        click.Option(["--seconds"], type=float, default=default.seconds, help="Wall-clock budget."),
        click.Option(["--seed"], type=int, default=default.seed, show_default=True),
        click.Option(["--dataset"], type=int, default=default.dataset,
                     help="Learn offline from a dataset of N transitions (tabular)."),
        click.Option(["--behaviour"], type=click.Choice(["random", "epsilon-greedy"]), default=default.behaviour,
                     show_default=True, help="Behaviour policy that collects the --dataset."),
        click.Option(["--eval-episodes"], type=int, default=default.eval_episodes, show_default=True,
                     help="Greedy episodes after training (and at each --eval-every point)."),
        click.Option(["--eval-every"], type=int, default=default.eval_every, metavar="N",
                     help="Also evaluate greedily every N env steps during training (placement local): the "
                          "evaluation curve."),
        click.Option(["--on-actor-failure"], type=click.Choice(["continue", "stop"]), default=default.on_actor_failure,
                     show_default=True, help="Distributed runs: go on with the other actors, or stop the run."),
        click.Option(["--actor-restarts"], type=int, default=default.actor_restarts, show_default=True, metavar="N",
                     help="Distributed runs: replace an actor that dies, up to N times per actor (a new identity; "
                          "what the old one stored stays counted)."),
        click.Option(["--checkpoint-every"], type=float, default=default.checkpoint_every, metavar="SECONDS",
                     help="Distributed runs: write the learner and the replay node to --checkpoint-dir every SECONDS "
                          "(atomically: a run killed at any moment can be resumed)."),
        click.Option(["--checkpoint-dir"], default=default.checkpoint_dir, metavar="DIR",
                     help="Where --checkpoint-every writes; every role's host must see it [default: "
                          "checkpoints/TIME-ALGO-ENV]."),
        click.Option(["--resume"], default=None, metavar="DIR",
                     help="Continue the run whose checkpoints are in DIR, as it was configured, from its newest "
                          "checkpoint (only where its roles run and where its result goes may change)."),
        click.Option(["--launcher"], type=click.Choice(LAUNCHERS), default=default.launcher, show_default=True,
                     help="What starts a distributed run's roles: local processes, or a Ray cluster."),
        click.Option(["--ray-address"], default=default.ray_address, metavar="auto|HOST:PORT",
                     help="--launcher ray: the cluster to join [default: start Ray for this run]."),
        click.Option(["--place"], multiple=True, metavar="ROLE=NODE[,NODE]",
                     help="--launcher ray: where a role runs (replay, learner, actors): a node IP, node id or "
                          "custom resource (repeatable)."),
        click.Option(["--placement-strategy"], default=default.placement_strategy,
                     metavar="pack|spread|strict-pack|strict-spread",
                     help="--launcher ray: reserve the run's roles as bundles of one Ray placement group, placed "
                          "with Ray's strategy (pack: as few nodes as fit; spread: across nodes); removed at the end."),
        click.Option(["--bind"], default=default.bind, metavar="HOST",
                     help="Address the replay node listens on [default: loopback locally, the node's own IP on Ray]."),
        click.Option(["--hp"], multiple=True, metavar="KEY=VALUE", help="Override a hyperparameter (repeatable)."),
        click.Option(["--out"], default="results", show_default=True, help="Directory (or .json path) for the result."),
        click.Option(["--no-out"], is_flag=True, help="Do not write a result file."),
        click.Option(["--json", "as_json"], is_flag=True, help="Print the result document as JSON."),
    ]
    plugin_options = {}
    for option in _registry().run_options:
        name = "plugin_" + option.flag.lstrip("-").replace("-", "_")
        plugin_options[name] = option
        kind = click.Choice(option.choices) if option.choices else option.type
        params.append(click.Option([option.flag, name], type=kind, default=None,
                                   help=f"{option.help} [{option.kind} {option.component}, plugin {option.plugin}"
                                        + (f"; default: {option.default}" if option.default is not None else "") + "]"))

    def callback(**kw: Any) -> None:
        from rlbench.results import render
        from rlbench.runner import run

        config = _assemble_run(kw, plugin_options)
        result = run(config, progress=_Progress())
        if kw["as_json"]:
            _emit_json(result)
        else:
            click.echo(render(result))
        sys.exit(exit_code(result))

    return click.Command("run", params=params, callback=callback, context_settings=CONTEXT,
                         help="Train one configuration and record it. Ctrl-C, SIGTERM and SIGHUP stop it in order "
                              "and still write the result, marked incomplete. Exit status: 0 complete, 1 stopped "
                              "early (a role failed), 2 refused before it started, 128+N stopped by signal N "
                              "(130 Ctrl-C, 143 SIGTERM).")


def _parse_place(values: tuple[str, ...]) -> dict[str, Any]:
    """--place replay=NODE --place actors=NODE,NODE -> {"replay": "NODE", "actors": ["NODE", "NODE"]}."""
    place: dict[str, Any] = {}
    for item in values:
        role, sep, nodes = item.partition("=")
        if not sep or not role.strip() or not nodes.strip():
            raise click.BadParameter(f"{item!r} is not ROLE=NODE", param_hint="--place")
        names = [n.strip() for n in nodes.split(",") if n.strip()]
        place[role.strip()] = names if role.strip() == "actors" else names[0] if len(names) == 1 else names
    return place


def _assemble_run(kw: dict[str, Any], plugin_options: dict[str, Any]) -> Any:
    """The RunConfig of `rlbench run`: a run file's values (--config or --plan), then the options
    given on the command line over them."""
    from rlbench.config import RunConfig, read_toml, run_fields
    from rlbench.validate import options_from_flags

    ctx = click.get_current_context()
    given = {name for name in kw if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    if kw["resume"]:
        return _resumed_run(kw, given, plugin_options)
    if kw["config_file"] and kw["plan_file"]:
        raise click.UsageError("give --config or --plan, not both (a plan is a run file)")
    source = kw["config_file"] or kw["plan_file"]
    fields: dict[str, Any] = {name: kw[name] for name in RUN_FIELDS}
    hyperparameters: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    from_file: set[str] = set()
    if source:
        document = run_fields(read_toml(source), source=source, extra_tables=("plan", "sweep"))
        hyperparameters = document.pop("hyperparameters", {})
        flags = document.pop("options", {})
        document.pop("place", None)
        from_file = {name for name in document if name not in given}
        fields.update({name: document[name] for name in from_file})
    hyperparameters.update(_parse_hyperparameters(kw["hp"]))
    place = dict(document.get("place", {})) if source else {}
    place.update(_parse_place(kw["place"]))
    for name, option in plugin_options.items():
        if kw[name] is not None:
            flags[option.flag] = kw[name]
    # naming a transport asks for roles that talk over it; a run file that names its placement says
    # so itself (a local run's file may carry the transport it does not use)
    named_transport = "transport" in given or ("transport" in from_file and "placement" not in from_file)
    if fields["placement"] is None:  # a policy of several learners needs the replay node they share
        fields["placement"] = "server" if named_transport or fields["policy"] == "data-parallel" else "local"
    elif fields["placement"] == "local" and "transport" in given:
        raise click.UsageError(f"--transport {fields['transport']} has no effect with --placement local (the replay "
                               f"memory is inside the learner's process); use --placement server or in-network")
    config = RunConfig(**fields, hyperparameters=hyperparameters, place=place, out=None if kw["no_out"] else kw["out"])
    config.options = options_from_flags(flags, config, _registry())
    return config


# what `run --resume` takes from its own command line; everything else is the resumed run's
RESUME_FLAGS = {"resume": "--resume", "launcher": "--launcher", "ray_address": "--ray-address", "place": "--place",
                "bind": "--bind", "checkpoint_every": "--checkpoint-every", "out": "--out", "no_out": "--no-out",
                "as_json": "--json"}
RESUME_FLAGS["placement_strategy"] = "--placement-strategy"  # where its roles run, as --place


def _resumed_run(kw: dict[str, Any], given: set[str], plugin_options: dict[str, Any]) -> Any:
    from rlbench.runtime.checkpoint import resumed_config

    fixed = sorted(given - set(RESUME_FLAGS))
    if fixed:
        flag = (plugin_options[fixed[0]].flag if fixed[0] in plugin_options else
                {"config_file": "--config", "plan_file": "--plan"}.get(fixed[0], "--" + fixed[0].replace("_", "-")))
        raise click.UsageError(f"{flag}: --resume continues the run in {kw['resume']} as it was configured; it takes "
                               f"only {', '.join(RESUME_FLAGS.values())}")
    return resumed_config(kw["resume"], launcher=kw["launcher"], ray_address=kw["ray_address"],
                          place=_parse_place(kw["place"]) or None, bind=kw["bind"],
                          checkpoint_every=kw["checkpoint_every"] if "checkpoint_every" in given else None,
                          placement_strategy=kw["placement_strategy"],
                          out=None if kw["no_out"] else kw["out"])


# --------------------------------------------------------------------------------------------- bench
@cli.group()
def bench() -> None:
    """Micro-benchmarks, each printing peers side by side in one run."""


# Commands that live with their subject; each module imports only click at the top (`rlbench --help`
# stays fast and loads no matplotlib, scipy, torch or Ray).
COMMANDS = (("rlbench.report.cli", "sweep_command"), ("rlbench.report.cli", "report_command"),
            ("rlbench.report.cli", "compare_command"), ("rlbench.report.cli", "dashboard_command"),
            ("rlbench.plan.cli", "profile_command"), ("rlbench.plan.cli", "plan_command"),
            ("rlbench.cluster.cli", "ray_group"))
BENCH_COMMANDS = (("rlbench.bench.transport", "command"), ("rlbench.bench.replay", "command"),
                  ("rlbench.bench.compute", "command"), ("rlbench.bench.compute", "dqn_command"),
                  ("rlbench.bench.algo", "ddpg_command"),
                  ("rlbench.bench.runtime", "placement_command"), ("rlbench.bench.runtime", "actors_command"),
                  ("rlbench.bench.matrix", "command"), ("rlbench.cluster.cli", "launchers_command"),
                  ("rlbench.bench.access", "command"), ("rlbench.bench.attacks", "command"),
                  ("rlbench.bench.policies", "command"), ("rlbench.bench.scale", "command"),
                  ("rlbench.bench.weights", "command"))


def _attach_commands() -> None:
    import importlib

    for group, commands in ((cli, COMMANDS), (bench, BENCH_COMMANDS)):
        for module, attr in commands:
            group.add_command(getattr(importlib.import_module(module), attr))


_attach_commands()


def _stop_at_once(signum: int, frame: Any) -> None:
    raise SignalInterrupt(signum, "stopped at once")


def main() -> None:
    # Outside a run's own window (rlbench.runner: the first signal stops a run in order), SIGTERM and
    # SIGHUP interrupt at once and exit 128 + N like Ctrl-C's 130, never by the default action: a
    # second SIGTERM that landed just after a run had stopped killed the process as it wrote the result
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_at_once)
    try:
        _main()
    finally:
        # the interpreter's shutdown puts the default actions back: a signal then would kill the process
        # (exit -15) after its work is done; it exits with the status it chose instead
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})


def _main() -> None:
    try:
        cli.main(standalone_mode=False, prog_name="rlbench")
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        # click hands a KeyboardInterrupt on as Abort; a second stop signal during a run (or one outside
        # a run) is an errors.SignalInterrupt, which carries its number (143 for SIGTERM)
        interrupt = exc.__cause__ if isinstance(exc, click.exceptions.Abort) else exc
        click.echo(str(interrupt or "") or "interrupted", err=True)
        sys.exit(128 + getattr(interrupt, "signum", signal.SIGINT))
    except click.UsageError as exc:  # one line, not click's three
        command = exc.ctx.command_path if exc.ctx else "rlbench"
        click.echo(f"error: {exc.format_message()} (see '{command} --help')", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(2)
    except RlbenchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
