"""A refusal names only transports that would work: where the roles may span hosts (a cluster
launcher, --bind, a launcher that placed them on several hosts), every transport it suggests crosses
hosts by its registered capabilities (and processes, in order): never inproc, shm, uds or any other
one-host transport. Every refusal path that suggests transports is taken, with every installed
plugin's transports registered beside test ones that cover each kind of refusal."""

from __future__ import annotations

import re

import pytest

from rlbench import plugins
from rlbench.config import RunConfig
from rlbench.errors import InvalidCombinationError
from rlbench.hookspecs import hookimpl
from rlbench.protocols import TransportCapabilities
from rlbench.runner import check
from rlbench.validate import check_hosts, validate

TCP = "rlbench.builtin.transports.tcp:TcpTransport"
SUGGESTED = re.compile(r"transports? that (?:would work|cross hosts): ([^;]*)$")


class TestTransports:
    """One of each kind a refusal must not suggest across hosts, and ones that trigger each refusal."""

    @hookimpl
    def rlbench_register_transports(self, register):
        def caps(**kw):
            return TransportCapabilities(**{"max_message_bytes": 1 << 31, "reliable": True, "ordered": True,
                                            "crosses_processes": True, "crosses_hosts": True, **kw})

        register("onehost", TCP, capabilities=caps(crosses_hosts=False))  # like shm and uds
        register("oneprocess", TCP, capabilities=caps(crosses_processes=False, crosses_hosts=False))  # like inproc
        register("tiny", TCP, capabilities=caps(max_message_bytes=4096))
        register("unordered", TCP, capabilities=caps(ordered=False))


@pytest.fixture(scope="module")
def registry():
    registry, _ = plugins.build([("suggestions", TestTransports())])  # and every installed plugin's
    return registry


def suggested(registry, error: InvalidCombinationError) -> list[str]:
    found = SUGGESTED.search(str(error))
    assert found, f"no transports suggested: {error}"
    names = found.group(1).split(", ")
    assert names != ["none registered"] and all(n in registry.names("transport") for n in names), str(error)
    return names


def assert_all_cross_hosts(registry, names: list[str], error) -> None:
    for name in names:
        caps = registry.get("transport", name).capabilities
        assert caps.crosses_hosts and caps.crosses_processes and caps.ordered, f"{name} suggested across hosts: {error}"
    assert "tcp" in names and not {"inproc", "shm", "uds", "onehost", "oneprocess"} & set(names), str(error)


SPANS = [{"launcher": "ray", "ray_address": "10.0.0.1:6379"}, {"bind": "0.0.0.0"},
         {"launcher": "ray", "bind": "10.0.0.1"}]


@pytest.mark.parametrize("span", SPANS, ids=["launcher-ray", "bind", "launcher-ray+bind"])
@pytest.mark.parametrize("transport, refusal", [
    ("inproc", "stays inside one process"),
    ("oneprocess", "stays inside one process"),
    ("unordered", "may reorder messages"),
    ("tiny", "carries at most 4,096 bytes per message"),  # the run's largest message, checked before it starts
])
def test_refusals_across_hosts_suggest_only_transports_that_cross_hosts(registry, span, transport, refusal):
    with pytest.raises(InvalidCombinationError, match=refusal) as info:
        check(RunConfig(placement="server", transport=transport, actors=2, eval_episodes=0, **span), registry)
    assert_all_cross_hosts(registry, suggested(registry, info.value), info.value)


@pytest.mark.parametrize("transport", ["shm", "onehost", "uds"])
def test_bind_with_a_one_host_transport_suggests_only_transports_that_cross_hosts(registry, transport):
    if transport not in registry.names("transport"):
        pytest.skip(f"transport {transport} is not installed")
    with pytest.raises(InvalidCombinationError, match="stays on one host") as info:
        validate(RunConfig(placement="server", transport=transport, bind="0.0.0.0"), registry)
    assert_all_cross_hosts(registry, suggested(registry, info.value), info.value)


@pytest.mark.parametrize("transport, unreachable", [
    ("shm", ""), ("onehost", ""), ("uds", ""),
    ("tcp", "as configured it listens on a socket of this host"),  # e.g. dpdk's memif port
])
def test_roles_placed_on_several_hosts_get_only_transports_that_cross_hosts(registry, transport, unreachable):
    if transport not in registry.names("transport"):
        pytest.skip(f"transport {transport} is not installed")
    plan = validate(RunConfig(placement="server", transport=transport), registry)
    check_hosts(plan, registry, ["10.0.0.1", "10.0.0.1"])  # one host: nothing to refuse
    with pytest.raises(InvalidCombinationError, match="this run places roles on 2 hosts") as info:
        check_hosts(plan, registry, ["10.0.0.1", "10.0.0.2"], unreachable)
    assert_all_cross_hosts(registry, suggested(registry, info.value), info.value)


def test_on_one_host_the_same_refusal_may_suggest_one_host_transports(registry):
    """The filter is the span: a run whose roles stay on this host may use shm (the control)."""
    with pytest.raises(InvalidCombinationError, match="stays inside one process") as info:
        validate(RunConfig(placement="server", transport="inproc"), registry)
    names = suggested(registry, info.value)
    assert {"shm", "onehost", "tcp"} <= set(names) and "oneprocess" not in names
