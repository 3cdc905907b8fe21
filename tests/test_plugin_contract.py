"""The plugin contract at its edges (issue #21, items 6-9): names belong to one plugin and a clash
refuses a plugin wholly; a lowered transport limit is checked before a run starts; the conformance
kits check what a run really asks of a transport and an environment; exit codes and refusals say
what happened and suggest only what would work."""

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
    (ListensOnlyWhereItChooses, r"listen\('tcp://127.0.0.1:0'\) \(what --bind 127.0.0.1 and --launcher ray hand "
                                r"it\) raised AddressError"),
    (ReportsThePortItWasGiven, r"listening at tcp://127.0.0.1:0 \(what --bind 127.0.0.1 and --launcher ray hand it\), "
                               r"its address tcp://127.0.0.1:0 cannot be reached"),
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
        with pytest.raises(AssertionError, match=r"listen\('tcpalias://127.0.0.1:0'\) \(what --bind 127.0.0.1"):
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
