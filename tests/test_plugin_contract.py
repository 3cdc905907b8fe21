"""The plugin contract at its edges (issue #21, items 6-9): names belong to one plugin and a clash
refuses a plugin wholly; a lowered transport limit is checked before a run starts; the conformance
kits check what a run really asks of a transport and an environment; exit codes and refusals say
what happened and suggest only what would work. Issue #42, items 1-3: the contract has a version,
a changelog and deprecations; names are one normalised namespace (flags, commands, entry points);
a plugin whose any hook raises is refused wholly."""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from ray_support import ray_unavailable
from support import REPO, rlb_processes, run_cli, write_plugin_dist
from rlbench import plugins
from rlbench.builtin.transports.inproc import InprocTransport
from rlbench.builtin.transports.tcp import TcpTransport
from rlbench.config import RunConfig
from rlbench.errors import InvalidCombinationError
from rlbench.hookspecs import hookimpl
from rlbench.kit.framing import AddressError
from rlbench.protocols import EnvironmentCapabilities, StepResult, TransportCapabilities
from rlbench.testing import check_environment, check_transport

CROSSES_HOSTS = TransportCapabilities(max_message_bytes=1 << 20, reliable=True, ordered=True, crosses_processes=True,
                                      crosses_hosts=True)
ONE_HOST = TransportCapabilities(max_message_bytes=1 << 20, reliable=True, ordered=True, crosses_processes=True,
                                 crosses_hosts=False)
CHAIN_LIKE = EnvironmentCapabilities(action_space="discrete", observation_space="discrete")


# ================================================================ 6. one name, one plugin
class Zmq:
    """What the zmq author shipped: a transport and an environment, a run option each."""

    @hookimpl
    def rlbench_register_transports(self, register):
        register("zmq", "rlbench.builtin.transports.tcp:TcpTransport", capabilities=CROSSES_HOSTS)

    @hookimpl
    def rlbench_register_environments(self, register):
        register("zmq-env", "x:y", capabilities=CHAIN_LIKE)

    @hookimpl
    def rlbench_register_run_options(self, option):
        option("environment", "zmq-env", "--zmq-env-size", "size", type=int)
        option("transport", "zmq", "--port", "port", type=int)


class Other:
    """Another plugin that takes the same unprefixed flag."""

    @hookimpl
    def rlbench_register_transports(self, register):
        register("other", "rlbench.builtin.transports.tcp:TcpTransport", capabilities=CROSSES_HOSTS)

    @hookimpl
    def rlbench_register_run_options(self, option):
        option("transport", "other", "--port", "port", type=int)


def loaded(registry) -> dict:
    """What a registry holds, order aside: components, options and refused plugins."""
    return {"components": sorted((c.kind, c.name, c.plugin) for c in registry.components()),
            "options": sorted((o.flag, o.plugin) for o in registry.run_options),
            "broken": sorted((b.name, b.error) for b in registry.broken),
            "plugins": sorted(registry.plugins)}


def test_a_flag_two_plugins_claim_refuses_both_wholly_whatever_the_load_order():
    forward, _ = plugins.build([("zmq", Zmq()), ("other", Other())], load_entry_points=False)
    backward, _ = plugins.build([("other", Other()), ("zmq", Zmq())], load_entry_points=False)
    assert loaded(forward) == loaded(backward)
    for name in ("zmq", "other"):  # nothing of either: no component, no option
        assert name not in forward.names("transport")
        assert not [o for o in forward.run_options if o.plugin == name]
    assert "zmq-env" not in forward.names("environment")
    errors = dict((b.name, b.error) for b in forward.broken)
    assert "run option --port is also registered by plugin 'other'" in errors["zmq"]
    assert "run option --port is also registered by plugin 'zmq'" in errors["other"]
    assert "dqn" in forward.names("algorithm")  # the rest loads as ever


class Tcp2:
    """A second plugin that registers a component named like the zmq plugin's (case aside)."""

    @hookimpl
    def rlbench_register_transports(self, register):
        register("lane", "x:y", capabilities=CROSSES_HOSTS)
        register("ZMQ", "x:y", capabilities=CROSSES_HOSTS)


def test_a_component_name_two_plugins_claim_refuses_both_wholly():
    for order in ([("zmq", Zmq()), ("tcp2", Tcp2())], [("tcp2", Tcp2()), ("zmq", Zmq())]):
        registry, _ = plugins.build(order, load_entry_points=False)
        assert not {"zmq", "ZMQ", "lane"} & set(registry.names("transport"))
        assert "zmq-env" not in registry.names("environment") and not registry.options_for("environment", "zmq-env")
        errors = dict((b.name, b.error) for b in registry.broken)
        assert "transport 'ZMQ' is also registered by plugin 'zmq'" in errors["tcp2"]
        assert "transport 'zmq' is also registered by plugin 'tcp2'" in errors["zmq"]


class ClaimsTheCore:
    """Registers its own transport, then one the core has, and a flag of `rlbench run`'s own."""

    @hookimpl
    def rlbench_register_transports(self, register):
        register("mine", "x:y", capabilities=CROSSES_HOSTS)
        register("tcp", "x:y", capabilities=CROSSES_HOSTS)

    @hookimpl
    def rlbench_register_run_options(self, option):
        option("transport", "mine", "--seed", "seed", type=int)


def test_the_cores_names_and_run_flags_are_reserved_and_a_claim_refuses_the_plugin_wholly():
    registry, _ = plugins.build([("greedy", ClaimsTheCore())], load_entry_points=False)
    assert registry.get("transport", "tcp").plugin == "builtin"
    assert "mine" not in registry.names("transport") and not [o for o in registry.run_options if o.plugin == "greedy"]
    error = dict((b.name, b.error) for b in registry.broken)["greedy"]
    assert "transport 'tcp' is already registered by plugin 'builtin'" in error
    assert "run option --seed is one of `rlbench run`'s own" in error
    assert "greedy" not in registry.plugins


class Trespasser:
    """An option for a component another plugin registers, and a name in another plugin's namespace."""

    @hookimpl
    def rlbench_register_environments(self, register):
        register("trespasser/Walk-v0", "x:y", capabilities=CHAIN_LIKE)
        register("gpu/Walk-v0", "x:y", capabilities=CHAIN_LIKE)

    @hookimpl
    def rlbench_register_run_options(self, option):
        option("transport", "tcp", "--tcp-nodelay", "nodelay", type=int)


def test_a_plugin_names_and_configures_only_its_own_components():
    registry, _ = plugins.build([("trespasser", Trespasser())], load_entry_points=False)
    assert not {"trespasser/Walk-v0", "gpu/Walk-v0"} & set(registry.names("environment"))
    assert not registry.options_for("transport", "tcp")
    error = dict((b.name, b.error) for b in registry.broken)["trespasser"]
    assert "environment 'gpu/Walk-v0' is in the namespace of plugin 'gpu'" in error
    assert "run option --tcp-nodelay is for transport 'tcp', which plugin 'builtin' registers" in error


def test_a_namespaced_name_of_the_plugins_own_is_accepted():
    class Owner:
        @hookimpl
        def rlbench_register_environments(self, register):
            register("owner/Walk-v0", "x:y", capabilities=CHAIN_LIKE)

    registry, _ = plugins.build([("owner", Owner())], load_entry_points=False)
    assert registry.get("environment", "owner/Walk-v0").plugin == "owner" and not registry.broken


def test_a_hook_that_fails_half_way_leaves_nothing_of_its_plugin():
    class HalfWay:
        @hookimpl
        def rlbench_register_transports(self, register):
            register("half", "x:y", capabilities=CROSSES_HOSTS)
            raise RuntimeError("the licence server is down")

        @hookimpl
        def rlbench_register_run_options(self, option):
            option("transport", "half", "--half-speed", "speed", type=int)

    registry, manager = plugins.build([("halfway", HalfWay())], load_entry_points=False)
    assert "half" not in registry.names("transport") and not [o for o in registry.run_options if o.plugin == "halfway"]
    assert "the licence server is down" in dict((b.name, b.error) for b in registry.broken)["halfway"]
    assert not manager.has_plugin("halfway")  # none of its other hooks (commands, fingerprint) run either


ZMQ_DIST = """
from rlbench.hookspecs import hookimpl
from rlbench.protocols import TransportCapabilities

@hookimpl
def rlbench_register_transports(register):
    register("{name}", "rlbench.builtin.transports.tcp:TcpTransport",
             capabilities=TransportCapabilities(1 << 20, True, True, True, True))

@hookimpl
def rlbench_register_run_options(option):
    option("transport", "{name}", "--port", "port", type=int, help="{name}'s port")
"""


def test_rlbench_list_says_why_both_clashing_plugins_are_refused_and_run_still_works(plugin_dir):
    for name in ("zmq", "nng"):
        write_plugin_dist(plugin_dir, f"rlbench-{name}", name, f"rlbench_{name}", ZMQ_DIST.format(name=name))
    listing = run_cli("list", "--json")
    assert listing.returncode == 0, listing.stderr
    data = json.loads(listing.stdout)
    refused = {b["plugin"]: b["error"] for b in data["broken_plugins"]}
    assert "run option --port is also registered by plugin 'nng'" in refused["zmq"]
    assert "run option --port is also registered by plugin 'zmq'" in refused["nng"]
    assert not [c for c in data["components"] if c["plugin"] in ("zmq", "nng")]
    text = run_cli("list").stdout
    assert "plugin 'zmq'" in text and "plugin 'nng'" in text
    helptext = run_cli("run", "--help")
    assert helptext.returncode == 0 and "--port" not in helptext.stdout


def test_the_reserved_run_flags_are_exactly_the_flags_rlbench_run_takes():
    from rlbench.cli import _run_command
    from rlbench.config import RUN_FLAGS

    own = {flag for param in _run_command().params if not param.name.startswith("plugin_")
           for flag in param.opts + param.secondary_opts if flag.startswith("--")}
    assert own | {"--help"} == set(RUN_FLAGS)


# ================================================================ 7. the limit the run will use
class NarrowTcp:
    """tcp under another name, whose run option lowers its limit (what the zmq plugin offered)."""

    @hookimpl
    def rlbench_register_transports(self, register):
        register("narrow", "rlbench.builtin.transports.tcp:TcpTransport",
                 capabilities=TransportCapabilities(max_message_bytes=1 << 31, reliable=True, ordered=True,
                                                    crosses_processes=True, crosses_hosts=True))

    @hookimpl
    def rlbench_register_run_options(self, option):
        option("transport", "narrow", "--narrow-max-message-bytes", "max_message_bytes", type=int)


def test_a_transport_limit_lowered_by_an_option_is_checked_before_the_run_starts():
    from rlbench.runner import check
    from rlbench.validate import options_from_flags

    registry, _ = plugins.build([("narrow", NarrowTcp())], load_entry_points=False)
    config = RunConfig(placement="server", transport="narrow", actors=2, steps=500, eval_episodes=0)
    config.options = options_from_flags({"narrow-max-message-bytes": 16384}, config, registry)  # as a run file gives it
    with pytest.raises(InvalidCombinationError, match=r"transport narrow as configured carries at most 16,384 bytes "
                                                      r"per message \(max_message_bytes=16,384\), but this run's "
                                                      r"largest message, PARAMS \(the policy's weights\), is [\d,]+ bytes"):
        check(config, registry)
    config.options = options_from_flags({"narrow-max-message-bytes": 1 << 20}, config, registry)
    check(config, registry)  # a limit that holds the largest message passes


# ================================================================ 8. the transport kit
class ListensOnlyWhereItChooses(TcpTransport):
    """Passes listen(None), but refuses the NAME://HOST:0 that --bind and Ray hand a transport."""

    def listen(self, address=None):
        if address is not None:
            raise AddressError(f"tcp: I choose where I listen, not {address}")
        return super().listen()


class ReportsThePortItWasGiven(TcpTransport):
    """Listens on NAME://HOST:0, but reports port 0 as its address, where no peer can connect."""

    def listen(self, address=None):
        listener = super().listen(address)
        if address is not None:
            listener.address = address
        return listener


class IgnoresTheHost(TcpTransport):
    """Listens where it always does, whatever HOST NAME://HOST:0 names: reached on this host, never from
    another host at the address --bind gave it. The kit handed it 127.0.0.1, where it listens anyway."""

    def listen(self, address=None):
        return super().listen("tcp://127.0.0.1:0" if address is not None else None)


class SwallowsItsOptions(TcpTransport):
    """Any keyword goes: a misspelt option, or max_message_bytes, vanishes without a word."""

    def __init__(self, **options):
        super().__init__()


class DropsItsLimit(TcpTransport):
    """Refuses unknown options, but takes max_message_bytes only to drop it."""

    def __init__(self, **options):
        unknown = sorted(set(options) - {"max_message_bytes"})
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
        super().__init__()


class ConnectsWithoutItsLimit(TcpTransport):
    """Its listener keeps a lowered limit; its connections send and accept up to the capability."""

    def connect(self, address, timeout=10.0):
        limit, self.max_message_bytes = self.max_message_bytes, self.capabilities.max_message_bytes
        try:
            return super().connect(address, timeout)
        finally:
            self.max_message_bytes = limit


@pytest.mark.parametrize("broken, message", [
    (ListensOnlyWhereItChooses, r"listen\('tcp://127.0.0.2:0'\) \(what --bind 127.0.0.2 and --launcher ray hand "
                                r"it\) raised AddressError"),
    (ReportsThePortItWasGiven, r"listening at tcp://127.0.0.2:0 \(what --bind 127.0.0.2 and --launcher ray hand it\), "
                               r"its address tcp://127.0.0.2:0 cannot be reached"),
    (IgnoresTheHost, r"told to listen at tcp://127.0.0.2:0 \(what --bind 127.0.0.2 and --launcher ray hand it\), its "
                     r"listener's address is tcp://127.0.0.1:\d+: listen at the HOST of NAME://HOST:PORT"),
    (SwallowsItsOptions, r"accepted an unknown option \(rlbench_check_unknown_option=1\)"),
    (DropsItsLimit, r"factory\(max_message_bytes=300000\).max_message_bytes is 2147483648"),
    (ConnectsWithoutItsLimit, r"a connection made with max_message_bytes=300000: a message of 300001 B over "
                              r"max_message_bytes=300000 was accepted"),
])
def test_the_transport_kit_catches_what_a_run_would_find(broken, message):
    with pytest.raises(AssertionError, match=message):
        check_transport(broken, cross_process=False, timeout=3.0)


def test_the_transport_kit_takes_a_registered_name():
    check_transport("tcp", cross_process=False, sizes=(0, 1, 4096, 70_000))


ALIAS_DIST = """
from rlbench.hookspecs import hookimpl
from rlbench.protocols import TransportCapabilities

@hookimpl
def rlbench_register_transports(register):
    register("tcpalias", "rlbench.builtin.transports.tcp:TcpTransport",
             capabilities=TransportCapabilities(1 << 31, True, True, True, True))
"""


def test_the_transport_kit_hands_the_registered_name_as_a_run_does(plugin_dir):
    # registered under another name than its addresses' scheme: --bind would hand it tcpalias://HOST:0
    import rlbench

    write_plugin_dist(plugin_dir, "rlbench-tcpalias", "tcpalias", "rlbench_tcpalias", ALIAS_DIST)
    try:
        rlbench.get_registry(refresh=True)
        with pytest.raises(AssertionError, match=r"listen\('tcpalias://127.0.0.2:0'\) \(what --bind 127.0.0.2"):
            check_transport("tcpalias", cross_process=False, sizes=(0, 1, 4096))
    finally:  # the process-wide registry as it was, for the tests after this one
        import importlib

        for path in plugin_dir.glob("rlbench_tcpalias*"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        importlib.invalidate_caches()
        assert "tcpalias" not in rlbench.get_registry(refresh=True).plugins


# ================================================================ 8. the environment kit
class Walk:
    """A correct toy: copies walk on 0..6 from a random start in 0..2; 0 stays, 1 steps right, 2 left.
    Reaching 6 terminates with reward 1; an episode is truncated after 12 steps."""

    LIMIT = 12
    SIZE = 7

    def __init__(self, num_envs=1, *, seed=None):
        from rlbench.protocols import EnvSpec

        self.spec = EnvSpec(id="walk", num_envs=num_envs, observation_shape=(), observation_dtype="int64",
                            action_kind="discrete", n_actions=3, n_states=self.SIZE, max_episode_steps=self.LIMIT)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros(num_envs, np.int64)
        self.t = np.zeros(num_envs, np.int64)

    def start(self, rows):
        self.state[rows] = self.rng.integers(0, 3, size=int(np.count_nonzero(rows)))
        self.t[rows] = 0

    def reset(self, seed=None):
        self.rng = np.random.default_rng(self.seed if seed is None else seed)
        self.start(np.ones(self.spec.num_envs, bool))
        return self.state.copy()

    def checked(self, actions):
        actions = np.asarray(actions)
        if actions.shape != (self.spec.num_envs,) or actions.dtype.kind not in "iu":
            raise ValueError(f"walk: actions must be {self.spec.num_envs} integers")
        if ((actions < 0) | (actions > 2)).any():
            raise ValueError(f"walk: actions are 0, 1 or 2, got {actions}")
        return actions

    def move_one(self, row, action):
        self.state[row] = min(max(self.state[row] + (0, 1, -1)[action], 0), self.SIZE - 1)

    def step(self, actions):
        actions = self.checked(actions)
        for row, action in enumerate(actions):
            self.move_one(row, action)
        self.t += 1
        terminated = self.state == self.SIZE - 1
        truncated = ~terminated & (self.t >= self.LIMIT)
        final = self.state.copy()
        self.start(terminated | truncated)
        return StepResult(self.state.copy(), terminated.astype(np.float32), terminated, truncated, final)

    def close(self):
        pass


class MovesCopiesBeforeCheckingThem(Walk):
    """Moves each copy as it reaches it, so a bad action in the last row leaves the copies before it
    moved: unseen when they were given 0, which stays."""

    def checked(self, actions):
        actions = np.asarray(actions)
        if actions.shape != (self.spec.num_envs,):
            raise ValueError(f"walk: actions must be {self.spec.num_envs} integers")
        return actions

    def move_one(self, row, action):
        if action not in (0, 1, 2):
            raise ValueError(f"walk: action {action} of copy {row} is not 0, 1 or 2")
        super().move_one(row, action)


class CountsStepsBeforeCheckingThem(Walk):
    """Counts each copy's episode step as it checks its action: a refused step leaves the copies
    before the bad one a step older, which shows only when their episodes are truncated."""

    def checked(self, actions):
        actions = np.asarray(actions)
        if actions.shape != (self.spec.num_envs,):
            raise ValueError(f"walk: actions must be {self.spec.num_envs} integers")
        for row, action in enumerate(actions):
            self.t[row] += 1
            if action not in (0, 1, 2):
                raise ValueError(f"walk: action {action} of copy {row} is not 0, 1 or 2")
        self.t -= 1  # step() counts the step
        return actions


def test_the_correct_walk_passes_the_environment_kit():
    check_environment(Walk)


@pytest.mark.parametrize("broken", [MovesCopiesBeforeCheckingThem, CountsStepsBeforeCheckingThem])
def test_the_environment_kit_catches_a_partial_step(broken):
    with pytest.raises(AssertionError, match="a refused step changed the environment"):
        check_environment(broken)


# ================================================================ 9. exit codes and refusals
def foreign_address() -> str:
    """An IPv4 address of no interface of this machine: the replay node, once started, cannot listen there."""
    import socket

    for candidate in ("203.0.113.7", "198.51.100.7", "192.0.2.213"):  # documentation ranges (RFC 5737)
        with socket.socket() as probe:
            try:
                probe.bind((candidate, 0))
            except OSError:
                return candidate
    raise AssertionError("every documentation address is this machine's")


def test_a_replay_role_that_fails_after_the_start_stops_the_run_it_does_not_refuse_it():
    from rlbench.cli import EXIT_FAILED, exit_code
    from rlbench.runner import run

    config = RunConfig(placement="server", transport="tcp", actors=1, steps=300, eval_episodes=0,
                       bind=foreign_address())
    result = run(config)
    assert result["status"] == "incomplete"
    assert "the replay node exited before it listened" in result["status_reason"]
    assert exit_code(result) == EXIT_FAILED
    assert result["accounting"]["produced"] == 0 and result["accounting"]["balanced"]


def test_the_cli_exits_1_when_the_replay_role_fails_after_the_start(tmp_path):
    out = tmp_path / "result.json"
    done = run_cli("run", "--placement", "server", "--transport", "tcp", "--bind", foreign_address(), "--steps", "300",
                   "--out", str(out))
    assert done.returncode == 1, done.stderr
    saved = json.loads(out.read_text())
    assert saved["status"] == "incomplete" and "exited before it listened" in saved["status_reason"]


@pytest.mark.skipif(ray_unavailable() is not None, reason=str(ray_unavailable()))
def test_under_ray_a_replay_role_that_fails_after_ray_started_exits_1_and_leaves_no_ray_behind(tmp_path):
    out = tmp_path / "result.json"
    ray_dir = tempfile.mkdtemp(prefix="rlbray-")  # short: Ray's socket paths live under it
    try:
        done = run_cli("run", "--launcher", "ray", "--placement", "server", "--transport", "tcp", "--bind",
                       foreign_address(), "--steps", "300", "--out", str(out), env_extra={"RAY_TMPDIR": ray_dir},
                       timeout=300)
        assert done.returncode == 1, done.stderr
        saved = json.loads(out.read_text())
        assert saved["status"] == "incomplete" and "exited before it listened" in saved["status_reason"]
        assert saved["loop"]["launcher"]["name"] == "ray"
        deadline = time.monotonic() + 20
        while (left := [line for line in subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True)
                        .stdout.splitlines() if ray_dir in line]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == [], left  # the Ray the run started is gone with it
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_a_second_sigterm_exits_143_not_130():
    proc = subprocess.Popen([sys.executable, "-m", "rlbench", "run", "--placement", "server", "--transport", "tcp",
                             "--actors", "1", "--steps", "1000000", "--eval-episodes", "0", "--no-out",
                             "--hp", "learning_starts=200", "--hp", "batch_size=32"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not [name for _, name in rlb_processes() if name.startswith("rlb-actor")]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(3.0)  # the roles are running
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the first asks for an orderly stop; the second interrupts at once
        proc.send_signal(signal.SIGTERM)
        second = time.monotonic()
        stdout, stderr = proc.communicate(timeout=90)
        took = time.monotonic() - second
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    # at once: the roles are killed, not given the launcher's grace (it took 10.7 s, with a role's traceback)
    assert took < 6.0, f"exited {took:.1f} s after the second SIGTERM"
    deadline = time.monotonic() + 5
    while rlb_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rlb_processes() == []


class OneHostOnly:
    """A transport like examples' uds: crosses processes, not hosts; and one that may reorder."""

    @hookimpl
    def rlbench_register_transports(self, register):
        register("pipe", "x:y", capabilities=ONE_HOST)
        register("jumbled", "x:y", capabilities=dataclasses.replace(CROSSES_HOSTS, ordered=False))


@pytest.mark.parametrize("config", [
    RunConfig(placement="server", transport="inproc", launcher="ray"),
    RunConfig(placement="server", transport="inproc", bind="0.0.0.0"),
])
def test_a_refusal_suggests_only_transports_that_would_work_for_this_run(config):
    from rlbench.validate import validate

    registry, _ = plugins.build([("pipe", OneHostOnly())], load_entry_points=False)
    with pytest.raises(InvalidCombinationError) as refused:
        validate(config, registry)
    suggested = str(refused.value).rpartition("would work: ")[2].split(", ")
    assert "tcp" in suggested
    assert not {"shm", "pipe", "jumbled", "inproc"} & set(suggested), suggested


def test_a_refusal_on_one_host_still_suggests_the_one_host_transports():
    from rlbench.validate import validate

    registry, _ = plugins.build([("pipe", OneHostOnly())], load_entry_points=False)
    with pytest.raises(InvalidCombinationError) as refused:
        validate(RunConfig(placement="server", transport="inproc"), registry)
    suggested = str(refused.value).rpartition("would work: ")[2].split(", ")
    assert {"shm", "pipe", "tcp"} <= set(suggested) and "jumbled" not in suggested, suggested


# ================================================================ issue #42, item 1: a versioned contract
def test_the_plugin_api_has_a_version_whose_changelog_lists_each_contract_change():
    from rlbench.kit import API_VERSION
    from rlbench.kit.api import parse

    assert parse(API_VERSION) >= (1, 1)
    changelog = (REPO / "docs" / "plugin-api-changelog.md").read_text()
    assert f"\n## {API_VERSION}\n" in changelog  # each version has its section
    this_version = changelog.split(f"\n## {API_VERSION}\n", 1)[1].split("\n## ", 1)[0]
    for change in ("max_queued_bytes=", "bounded per-peer outbox", "expect_admission", "admit(peer)"):
        assert change in this_version, change


def plugin_targeting(version):
    """A plugin object that declares the plugin API it targets, with one prefixed run option."""

    class Targets:
        RLBENCH_API = version

        @hookimpl
        def rlbench_register_transports(self, register):
            register("aimed", "x:y", capabilities=CROSSES_HOSTS)

        @hookimpl
        def rlbench_register_run_options(self, option):
            option("transport", "aimed", "--aimed-port", "port", type=int)

    return Targets()


@pytest.mark.parametrize("version, reason", [
    ("2.0", "targets plugin API 2.0, a newer major version than this rlbench's 1.1"),
    ("0.9", "targets plugin API 0.9, an older major version than this rlbench's 1.1"),
    ("1.99", "targets plugin API 1.99, newer than this rlbench's 1.1: upgrade rlbench"),
    ("1.1.0", "RLBENCH_API must be a 'MAJOR.MINOR' string"),
])
def test_a_plugin_that_targets_an_api_this_rlbench_does_not_serve_is_refused_with_the_reason(version, reason):
    registry, manager = plugins.build([("aimed", plugin_targeting(version))], load_entry_points=False)
    assert "aimed" not in registry.names("transport") and not manager.has_plugin("aimed")
    assert reason in dict((b.name, b.error) for b in registry.broken)["aimed"]


@pytest.mark.parametrize("version", ["1.0", "1.1", None])
def test_a_plugin_that_targets_this_major_at_or_below_its_minor_loads(version):
    plugin = plugin_targeting(version)
    if version is None:
        del type(plugin).RLBENCH_API
    registry, _ = plugins.build([("aimed", plugin)], load_entry_points=False)
    assert registry.get("transport", "aimed").plugin == "aimed" and not registry.broken
    assert registry.targets["aimed"] == (version or "1.0")  # undeclared: the contract before versions


class Unprefixed:
    """A run option named without its owner's prefix, as the upmem plugin's --partition was."""

    @hookimpl
    def rlbench_register_compute_backends(self, register):
        from rlbench.builtin import capabilities

        register("sharder", "x:y", capabilities=capabilities.CPU)

    @hookimpl
    def rlbench_register_run_options(self, option):
        option("compute", "sharder", "--partition", "partition")


def test_an_unprefixed_flag_is_deprecated_for_a_1_0_plugin_and_refused_for_one_that_targets_1_1():
    from rlbench.kit import PluginAPIDeprecationWarning

    with pytest.warns(PluginAPIDeprecationWarning, match=r"--partition does not start with --sharder- or --sharding-"
                                                         r".*an error from 2.0"):
        registry, _ = plugins.build([("sharding", Unprefixed())], load_entry_points=False)
    assert registry.get("compute", "sharder").plugin == "sharding"
    assert "--partition" in [o.flag for o in registry.run_options]
    assert [plugin for plugin, _ in registry.deprecations] == ["sharding"]

    opted_in = Unprefixed()
    opted_in.RLBENCH_API = "1.1"
    registry, _ = plugins.build([("sharding", opted_in)], load_entry_points=False)
    assert "sharder" not in registry.names("compute")
    assert "a rule since plugin API 1.1" in dict((b.name, b.error) for b in registry.broken)["sharding"]


class QueuesWithoutBound(InprocTransport):
    """A transport written for plugin API 1.0: its factory takes no max_queued_bytes=."""

    def __init__(self, max_message_bytes=None):
        super().__init__(max_message_bytes)


def test_a_transport_written_for_api_1_0_passes_the_kit_with_a_warning_naming_2_0_not_a_failure():
    from rlbench.kit import PluginAPIDeprecationWarning

    with pytest.warns(PluginAPIDeprecationWarning, match=r"must take max_queued_bytes=.*an error from 2\.0"):
        check_transport(QueuesWithoutBound, cross_process=False, sizes=(0, 1, 4096), timeout=3.0)


def test_a_transport_whose_plugin_targets_1_1_fails_the_kit_without_max_queued_bytes(monkeypatch):
    class Declares:
        RLBENCH_API = "1.1"

        @hookimpl
        def rlbench_register_transports(self, register):
            register("unbounded", QueuesWithoutBound, capabilities=InprocTransport.capabilities)

    registry, manager = plugins.build([("declares", Declares())], load_entry_points=False)
    monkeypatch.setattr(plugins, "_registry", registry)  # the process-wide registry the kit reads
    monkeypatch.setattr(plugins, "_manager", manager)
    with pytest.raises(AssertionError, match=r"must take max_queued_bytes=.*a rule since plugin API 1\.1"):
        check_transport("unbounded", cross_process=False, sizes=(0, 1, 4096), timeout=3.0)


# ================================================================ issue #42, item 2: one normalised namespace
def flagged(plugin, flag):
    class Flagged:
        @hookimpl
        def rlbench_register_transports(self, register):
            register(plugin, "x:y", capabilities=CROSSES_HOSTS)

        @hookimpl
        def rlbench_register_run_options(self, option):
            option("transport", plugin, flag, "endpoint")

    return Flagged()


def test_flags_that_differ_only_in_dash_or_underscore_are_one_flag_refused_naming_both_spellings():
    registry, _ = plugins.build([("zmq", flagged("zmq", "--zmq-endpoint")),
                                 ("zmqx", flagged("zmqx", "--zmq_endpoint"))], load_entry_points=False)
    assert not {"zmq", "zmqx"} & set(registry.names("transport"))
    errors = dict((b.name, b.error) for b in registry.broken)
    assert "run option --zmq-endpoint is also registered by plugin 'zmqx' as --zmq_endpoint" in errors["zmq"]
    assert "run option --zmq_endpoint is also registered by plugin 'zmq' as --zmq-endpoint" in errors["zmqx"]
    registry, _ = plugins.build([("replay", flagged("replay-x", "--replay_shards"))], load_entry_points=False)
    assert ("run option --replay_shards is one of `rlbench run`'s own (--replay-shards)"
            in dict((b.name, b.error) for b in registry.broken)["replay"])


def commands_of(plugin, *paths):
    """A plugin that adds (or replaces) the commands at `paths` ("doctor", "bench transport")."""
    import click

    class Commands:
        @hookimpl
        def rlbench_register_transports(self, register):
            register(f"{plugin}-link", "x:y", capabilities=CROSSES_HOSTS)

        @hookimpl
        def rlbench_register_commands(self, cli):
            for path in paths:
                group, _, name = path.rpartition(" ")
                (cli.commands[group] if group else cli).add_command(click.Command(name, help=f"{plugin}'s"))

    return Commands()


def test_a_plugin_command_never_replaces_rlbenchs_own_or_another_plugins_command():
    registry, _ = plugins.build([("hijack", commands_of("hijack", "run")),
                                 ("benchy", commands_of("benchy", "bench transport")),
                                 ("one", commands_of("one", "doctor", "bench one")),
                                 ("two", commands_of("two", "Doctor"))], load_entry_points=False)
    errors = dict((b.name, b.error) for b in registry.broken)
    assert "command `rlbench run` is one of rlbench's own (a plugin adds commands, it never replaces one)" \
        in errors["hijack"]
    assert "command `rlbench bench transport` is one of rlbench's own" in errors["benchy"]
    assert "command `rlbench doctor` is also registered by plugin 'two' as Doctor" in errors["one"]
    assert "command `rlbench Doctor` is also registered by plugin 'one' as doctor" in errors["two"]
    assert registry.plugins == ["builtin"] and registry.commands == []
    assert not [n for n in registry.names("transport") if n.endswith("-link")]

    registry, _ = plugins.build([("one", commands_of("one", "doctor", "bench one"))], load_entry_points=False)
    assert [(c.plugin, c.path) for c in registry.commands] == [("one", "doctor"), ("one", "bench one")]


def test_rlbenchs_reserved_commands_are_exactly_its_own():
    from rlbench.cli import bench, cli
    from rlbench.config import CORE_COMMANDS

    own = {name for name in cli.commands if not any(c.path == name for c in plugins.get_registry().commands)}
    own |= {f"bench {name}" for name in bench.commands
            if not any(c.path == f"bench {name}" for c in plugins.get_registry().commands)}
    assert own | {"run"} == set(CORE_COMMANDS)


def test_two_distributions_with_one_entry_point_name_are_both_refused_in_one_line_naming_both(plugin_dir):
    import sys

    for dist, module in (("rlbench-fancy", "rlbench_fancy_a"), ("fancy-fork", "rlbench_fancy_b")):
        write_plugin_dist(plugin_dir, dist, "fancy", module, ZMQ_DIST.format(name=module))
    registry, _ = plugins.build()
    refusals = [b.error for b in registry.broken if b.name == "fancy"]
    assert len(refusals) == 2 and all(len(error) < 300 for error in refusals), refusals
    assert all("distribution 'rlbench-fancy'" in error and "distribution 'fancy-fork'" in error for error in refusals)
    assert not {"rlbench_fancy_a", "rlbench_fancy_b"} & set(registry.names("transport"))
    assert not {"rlbench_fancy_a", "rlbench_fancy_b"} & set(sys.modules)  # neither was imported: no winner


def test_rlbenchs_own_plugins_prefix_their_flags_so_a_third_partys_partition_loads_beside_upmem():
    upmem = pytest.importorskip("rlbench_upmem.plugin")
    with pytest.warns(DeprecationWarning, match="--partition"):  # the third party's, a 1.0 plugin's
        registry, _ = plugins.build([("upmem", upmem), ("sharding", Unprefixed())], load_entry_points=False)
    assert not registry.broken
    assert registry.get("compute", "upmem").plugin == "upmem" and registry.get("compute", "sharder")
    flags = {o.flag for o in registry.options_for("compute", "upmem")}
    assert {"--upmem-dpus", "--upmem-partition"} <= flags and not {"--dpus", "--partition"} & flags
    # the rule is enforced for the built-in plugins: they target this API, so a lapse refuses them
    assert registry.targets["builtin"] == registry.targets["upmem"] == "1.1"
    assert [plugin for plugin, _ in registry.deprecations] == ["sharding"]


# ================================================================ issue #42, item 3: no half-loading
class RaisesIn:
    """A transport and a run option, and one hook that raises."""

    def __init__(self, hook):
        self.hook = hook

    @hookimpl
    def rlbench_register_transports(self, register):
        register("half", "x:y", capabilities=CROSSES_HOSTS)

    @hookimpl
    def rlbench_register_run_options(self, option):
        option("transport", "half", "--half-speed", "speed", type=int)

    @hookimpl
    def rlbench_register_commands(self, cli):
        if self.hook == "commands":
            raise RuntimeError("click is too old")

    @hookimpl
    def rlbench_fingerprint(self):
        if self.hook == "fingerprint":
            raise RuntimeError("no device node")
        return {"devices": 0}


def nothing_of(registry, plugin):
    return ("half" not in registry.names("transport") and not [o for o in registry.run_options if o.plugin == plugin]
            and not [c for c in registry.commands if c.plugin == plugin] and plugin not in registry.plugins)


def test_a_plugin_whose_commands_hook_raises_is_refused_wholly():
    registry, manager = plugins.build([("halfway", RaisesIn("commands"))], load_entry_points=False)
    assert nothing_of(registry, "halfway") and not manager.has_plugin("halfway")
    assert "rlbench_register_commands failed: RuntimeError: click is too old" in \
        dict((b.name, b.error) for b in registry.broken)["halfway"]


def test_a_plugin_whose_fingerprint_raises_is_refused_wholly_and_rlbench_list_says_why(monkeypatch):
    from click.testing import CliRunner

    from rlbench.cli import list_components
    from rlbench.errors import UnknownComponentError
    from rlbench.fingerprint import machine_fingerprint
    from rlbench.runner import run

    registry, manager = plugins.build([("halfway", RaisesIn("fingerprint"))], load_entry_points=False)
    monkeypatch.setattr(plugins, "_registry", registry)  # what `rlbench list` reads
    monkeypatch.setattr(plugins, "_manager", manager)
    listing = CliRunner().invoke(list_components, ["--json"])
    assert listing.exit_code == 0, listing.output
    data = json.loads(listing.output)
    assert not [c for c in data["components"] if c["plugin"] == "halfway"]
    assert "rlbench_fingerprint failed: RuntimeError: no device node" in \
        {b["plugin"]: b["error"] for b in data["broken_plugins"]}["halfway"]
    assert nothing_of(registry, "halfway") and not manager.has_plugin("halfway")
    assert "halfway" not in machine_fingerprint(registry)["plugins"]

    registry, _ = plugins.build([("halfway", RaisesIn("fingerprint"))], load_entry_points=False)
    with pytest.raises(UnknownComponentError, match="plugins that failed to load: halfway"):  # before any role starts
        run(RunConfig(placement="server", transport="half", steps=100, eval_episodes=0, out=None), registry=registry)
