"""rlbench.testing.registered: a plugin in this process's registry for a test, without installing it."""

from __future__ import annotations

import pytest

import rlbench
from rlbench.hookspecs import hookimpl
from rlbench.protocols import ReplayCapabilities
from rlbench.testing import registered


class Scratch:
    RLBENCH_API = "1.1"

    @hookimpl
    def rlbench_register_replay_memories(self, register):
        register("scratch", "rlbench.builtin.replay:UniformReplay", capabilities=ReplayCapabilities(prioritized=False),
                 description="a test's replay memory")


class Greedy:
    @hookimpl
    def rlbench_register_replay_memories(self, register):
        register("uniform", "x:y", capabilities=ReplayCapabilities(prioritized=False))  # the core's name


def test_a_registered_plugin_is_in_the_registry_for_the_block_only():
    before = rlbench.get_registry()
    with registered(installed=False, scratch=Scratch()) as registry:
        assert rlbench.get_registry() is registry
        assert registry.get("replay", "scratch").plugin == "scratch"
        assert "uniform" in registry.names("replay")  # the built-ins stay
    assert rlbench.get_registry() is before and "scratch" not in before.names("replay")


def test_a_refused_plugin_raises_with_why():
    with pytest.raises(AssertionError, match="plugin 'greedy' was refused: .*uniform"):
        with registered(installed=False, greedy=Greedy()):
            pass


def test_a_registered_plugin_stands_in_for_an_installed_one_of_the_same_name():
    from rlbench import plugins

    installed, _ = plugins.build()
    name = next((n for n in installed.plugins if n != plugins.BUILTIN), None)
    if name is None:
        pytest.skip("no third-party plugin installed here")
    with registered(**{name: Scratch()}) as registry:
        assert name in registry.plugins and registry.get("replay", "scratch").plugin == name
        assert not [b for b in registry.broken if b.name == name]
