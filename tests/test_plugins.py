"""Plugin loading: built-ins through the same hooks, entry points, broken and disabled plugins."""

from __future__ import annotations

import json

import pytest

from support import run_cli, write_plugin_dist
from rlbench import plugins
from rlbench.errors import RlbenchError, UnavailableComponentError, UnknownComponentError
from rlbench.hookspecs import hookimpl
from rlbench.protocols import Probe, ReplayCapabilities, TransportCapabilities

GOOD_PLUGIN = """
from rlbench.hookspecs import hookimpl
from rlbench.protocols import ReplayCapabilities, Probe

@hookimpl
def rlbench_register_replay_memories(register):
    register("fancy", "fancy_replay_impl:FancyReplay", capabilities=ReplayCapabilities(prioritized=False),
             probe=lambda: Probe.missing("needs the fancy board: install fancy-driver"))

@hookimpl
def rlbench_register_run_options(option):
    option("replay", "fancy", "--fancy-banks", "banks", type=int, help="memory banks")

@hookimpl
def rlbench_fingerprint():
    return {"boards": 0}
"""


def test_builtins_register_through_the_hooks():
    registry, manager = plugins.build(load_entry_points=False)
    assert manager.has_plugin("builtin")
    assert {"inproc", "shm", "tcp", "udp"} <= set(registry.names("transport"))
    assert {"uniform", "prioritized"} <= set(registry.names("replay"))
    assert {"dqn", "ddpg", "qlearning", "sarsa"} <= set(registry.names("algorithm"))
    assert all(c.plugin == "builtin" for c in registry.components())


def test_third_party_plugin_via_entry_point(plugin_dir):
    write_plugin_dist(plugin_dir, "rlbench-fancy", "fancy", "rlbench_fancy", GOOD_PLUGIN)
    registry, _ = plugins.build()
    fancy = registry.get("replay", "fancy")
    assert fancy.plugin == "fancy"
    assert fancy.probe() == Probe(False, "needs the fancy board: install fancy-driver")
    assert [o.flag for o in registry.options_for("replay", "fancy")] == ["--fancy-banks"]
    with pytest.raises(UnavailableComponentError, match="fancy-driver"):
        fancy.create(capacity=10)


def test_broken_plugin_is_reported_not_fatal(plugin_dir):
    write_plugin_dist(plugin_dir, "rlbench-broken", "broken", "rlbench_broken", "raise ImportError('libfoo.so: cannot open')\n")
    registry, _ = plugins.build()
    assert [b.name for b in registry.broken] == ["broken"]
    assert "libfoo.so" in registry.broken[0].error
    assert "dqn" in registry.names("algorithm")  # everything else still works

    listing = run_cli("list", "--json")
    assert listing.returncode == 0, listing.stderr
    data = json.loads(listing.stdout)
    assert data["broken_plugins"][0]["plugin"] == "broken"
    assert "libfoo.so" in data["broken_plugins"][0]["error"]
    text = run_cli("list")
    assert "plugin 'broken' failed to load" in text.stdout


def test_plugin_whose_hook_raises_is_reported(plugin_dir):
    write_plugin_dist(plugin_dir, "rlbench-raises", "raises", "rlbench_raises", """
        from rlbench.hookspecs import hookimpl
        @hookimpl
        def rlbench_register_transports(register):
            raise RuntimeError("no licence")
    """)
    registry, _ = plugins.build()
    assert any(b.name == "raises" and "no licence" in b.error for b in registry.broken)


def test_disable_by_name(plugin_dir, monkeypatch):
    write_plugin_dist(plugin_dir, "rlbench-fancy", "fancy", "rlbench_fancy", GOOD_PLUGIN)
    monkeypatch.setenv("RLBENCH_DISABLE_PLUGINS", "fancy")
    registry, _ = plugins.build()
    assert "fancy" not in registry.names("replay")
    assert "fancy" not in registry.plugins
    monkeypatch.setenv("RLBENCH_DISABLE_PLUGINS", "builtin, fancy")
    registry, _ = plugins.build()
    assert registry.names("algorithm") == []


def test_name_clash_is_refused_and_first_registration_kept():
    class Clash:
        @hookimpl
        def rlbench_register_transports(self, register):
            register("tcp", "x:y", capabilities=TransportCapabilities(1, True, True, True, True))

    registry, _ = plugins.build([("clash", Clash())], load_entry_points=False)
    assert registry.get("transport", "tcp").plugin == "builtin"
    assert any(b.name == "clash" and "already registered by plugin 'builtin'" in b.error for b in registry.broken)


def test_wrong_capabilities_type_is_refused():
    class Wrong:
        @hookimpl
        def rlbench_register_replay_memories(self, register):
            register("odd", "x:y", capabilities=TransportCapabilities(1, True, True, True, True))

    registry, _ = plugins.build([("wrong", Wrong())], load_entry_points=False)
    assert "odd" not in registry.names("replay")
    assert any("ReplayCapabilities" in b.error for b in registry.broken)


def test_did_you_mean():
    registry, _ = plugins.build(load_entry_points=False)
    with pytest.raises(UnknownComponentError, match="did you mean 'prioritized'"):
        registry.get("replay", "priortized")
    with pytest.raises(UnknownComponentError, match="known: "):
        registry.get("transport", "carrier-pigeon")
    assert registry.get("environment", "cartpole-v1").name == "CartPole-v1"  # case is not a typo


def test_lazy_factory_and_failing_probe():
    class Lazy:
        @hookimpl
        def rlbench_register_replay_memories(self, register):
            register("lazy", "rlbench.builtin.envs:GymnasiumEnv", capabilities=ReplayCapabilities(prioritized=False))
            register("crashy", "x:y", capabilities=ReplayCapabilities(prioritized=False),
                     probe=lambda: 1 / 0)

    registry, _ = plugins.build([("lazy", Lazy())], load_entry_points=False)
    assert callable(registry.get("replay", "lazy").load())
    crashy = registry.get("replay", "crashy").probe()
    assert not crashy.available and "ZeroDivisionError" in crashy.reason


def test_register_rejects_bad_factory():
    class Bad:
        @hookimpl
        def rlbench_register_transports(self, register):
            register("bad", "no-colon-here", capabilities=TransportCapabilities(1, True, True, True, True))

    registry, _ = plugins.build([("bad", Bad())], load_entry_points=False)
    assert "bad" not in registry.names("transport")
    assert any("module:attr" in b.error for b in registry.broken)


def test_plugin_run_option_reaches_only_its_component(plugin_dir):
    write_plugin_dist(plugin_dir, "rlbench-fancy", "fancy", "rlbench_fancy", GOOD_PLUGIN)
    result = run_cli("run", "--fancy-banks", "4", "--no-out")
    assert result.returncode == 2
    assert "--fancy-banks applies to replay fancy, which this run does not use" in result.stderr
    helptext = run_cli("run", "--help")
    assert "--fancy-banks" in helptext.stdout


def test_rlbench_error_is_an_exception_users_can_catch():
    assert issubclass(UnknownComponentError, RlbenchError)


TWO_LANE_PLUGIN = """
import functools
from rlbench.hookspecs import hookimpl
from rlbench.protocols import EnvironmentCapabilities

CAPS = EnvironmentCapabilities(action_space="discrete", observation_space="discrete")

@hookimpl
def rlbench_register_environments(register):
    register("lane", functools.partial(make, "lane"), capabilities=CAPS)
    register("onehot-lane", functools.partial(make, "onehot-lane"), capabilities=CAPS)

@hookimpl
def rlbench_register_run_options(option):
    option("environment", "lane", "--lane-length", "length", type=int)
    option("environment", "onehot-lane", "--onehot-lane-length", "length", type=int)

def make(name, num_envs=1, *, seed=None, length=4):
    raise SystemExit(f"built {name} with length {length}")
"""


def test_run_options_are_matched_to_the_component_that_declared_them(plugin_dir):
    # Two environments each declare a `length` parameter: the flag decides, not the parameter name.
    from rlbench.config import RunConfig
    from rlbench.validate import options_from_flags, validate

    write_plugin_dist(plugin_dir, "rlbench-lanes", "lanes", "rlbench_lanes", TWO_LANE_PLUGIN)
    registry, _ = plugins.build()
    config = RunConfig(algo="qlearning", env="onehot-lane")
    assert options_from_flags({"--onehot-lane-length": 6}, config, registry) == {"environment": {"length": 6}}
    with pytest.raises(RlbenchError, match="--lane-length applies to environment lane, which this run does not use"):
        options_from_flags({"--lane-length": 6}, config, registry)
    with pytest.raises(RlbenchError, match="did you mean '--lane-length'"):
        options_from_flags({"--lane-lenght": 6}, config, registry)
    config.options = {"environment": {"length": 6}}
    assert validate(config, registry).options == {"environment": {"length": 6}}
    result = run_cli("run", "--algo", "qlearning", "--env", "onehot-lane", "--onehot-lane-length", "6", "--no-out")
    assert "built onehot-lane with length 6" in result.stderr + result.stdout, result.stderr


def test_a_plugin_that_exits_at_import_is_listed_as_broken(plugin_dir):
    write_plugin_dist(plugin_dir, "rlbench-quitter", "quitter", "rlbench_quitter", "import sys\nsys.exit(3)\n")
    result = run_cli("list", "--json")
    assert result.returncode == 0, result.stderr
    broken = json.loads(result.stdout)["broken_plugins"]
    assert [b["plugin"] for b in broken] == ["quitter"] and "SystemExit: 3" in broken[0]["error"]
    assert run_cli("run", "--algo", "qlearning", "--env", "FrozenLake-v1", "--steps", "200", "--eval-episodes", "1",
                   "--no-out").returncode == 0
