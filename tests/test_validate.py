"""Invalid combinations are refused before a run starts, with what would work instead."""

from __future__ import annotations

import pytest

from rlbench import plugins
from rlbench.config import RunConfig, apply_overrides, parse_value
from rlbench.errors import InvalidCombinationError, RlbenchError, UnavailableComponentError, UnknownComponentError
from rlbench.hookspecs import hookimpl
from rlbench.protocols import ComputeCapabilities, Probe
from rlbench.validate import validate


class TableOnly:
    @hookimpl
    def rlbench_register_compute_backends(self, register):
        register("tables", "x:y", capabilities=ComputeCapabilities(
            roles=frozenset({"qlearning:tabular", "sarsa:tabular"}), does_not="no neural networks"))
        register("absent", "x:y", capabilities=ComputeCapabilities(roles=frozenset({"*:tabular"})),
                 probe=lambda: Probe.missing("board not found: plug it in"))


@pytest.fixture(scope="module")
def registry():
    registry, _ = plugins.build([("tables", TableOnly())], load_entry_points=False)
    return registry


@pytest.mark.parametrize("config, message", [
    (RunConfig(algo="ddpg", env="CartPole-v1"),
     "ddpg needs a continuous action space, but CartPole-v1 has a discrete one; environments that would work: "
     "MountainCarContinuous-v0, Pendulum-v1"),
    (RunConfig(algo="dqn", env="Pendulum-v1"), "environments that would work: CartPole-v1"),
    (RunConfig(algo="dqn", env="FrozenLake-v1"), "dqn needs continuous or image observations, but FrozenLake-v1 has discrete ones"),
    (RunConfig(algo="qlearning", env="CartPole-v1"), "environments that would work: FrozenLake-v1"),
    (RunConfig(algo="sarsa", env="Taxi-v3", replay="prioritized"), "uses no replay memory; drop --replay prioritized"),
    (RunConfig(algo="dqn", compute="tables"),
     "compute backend tables cannot run the dqn actor (no neural networks); compute backends that can: cpu"),
    (RunConfig(algo="dqn", dataset=1000), "dqn cannot learn from a dataset; algorithms that can: qlearning, sarsa"),
    (RunConfig(algo="sarsa", env="Taxi-v3", placement="server"), "sarsa runs with placement local only"),
    (RunConfig(placement="server", transport="inproc"), "transports that would work: shm, tcp, udp"),
    (RunConfig(actors=3), "placement local runs one actor"),
    (RunConfig(steps=0), "--steps must be at least 1"),
    (RunConfig(algo="qlearning", env="FrozenLake-v1", dataset=0), "--dataset must be at least 1"),
    (RunConfig(placement="server", transport="tcp", launcher="ray", placement_strategy="PACK"),
     "unknown --placement-strategy 'PACK'; did you mean 'pack'? choose one of pack, spread, strict-pack, strict-spread"),
    (RunConfig(placement="server", transport="tcp", launcher="ray", placement_strategy="spread", place={"actors": ["a"]}),
     "drop --place actors=..."),
])
def test_refused_with_what_would_work(registry, config, message):
    with pytest.raises(InvalidCombinationError) as info:
        validate(config, registry)
    assert message in str(info.value)


@pytest.mark.parametrize("config", [
    RunConfig(placement="server", transport="udp", bind="10.0.0.5"),
    RunConfig(placement="in-network", transport="udp", bind="0.0.0.0"),
    RunConfig(placement="server", transport="udp", launcher="ray"),  # its node's routable address
])
def test_udp_reachable_from_other_hosts_is_refused_unless_the_network_path_is_trusted(registry, config):
    """Issue #40: udp's datagrams carry no MAC after the handshake (whoever sends from a peer's address
    and port injects into its authenticated session), so a replay node other hosts reach over udp is
    refused before the run, naming the option that accepts it; with it, the run goes ahead."""
    import dataclasses

    with pytest.raises(InvalidCombinationError, match=r"udp trusts the network path.*--udp-trust-network") as info:
        validate(config, registry)
    assert "\n" not in str(info.value)
    validate(dataclasses.replace(config, options={"transport": {"trust_network": True}}), registry)


@pytest.mark.parametrize("bind", [None, "127.0.0.1", "::1", "localhost"])
def test_udp_on_loopback_needs_no_trust(registry, bind):
    validate(RunConfig(placement="server", transport="udp", bind=bind), registry)


def test_unavailable_component_refused_with_probe_reason(registry):
    with pytest.raises(UnavailableComponentError, match="board not found: plug it in"):
        validate(RunConfig(algo="qlearning", env="FrozenLake-v1", compute="absent"), registry)


def test_unknown_names(registry):
    with pytest.raises(UnknownComponentError, match="did you mean 'FrozenLake-v1'"):
        validate(RunConfig(algo="qlearning", env="FrozenLak-v1"), registry)


def test_valid_plans(registry):
    plan = validate(RunConfig(), registry)
    assert plan.replay.name == "prioritized" and plan.transport is None
    plan = validate(RunConfig(algo="sarsa", env="Taxi-v3", compute="tables", dataset=100), registry)
    assert plan.replay is None and plan.compute.name == "tables"
    assert validate(RunConfig(replay="uniform"), registry).replay.name == "uniform"


def test_hyperparameter_overrides():
    from dataclasses import dataclass

    @dataclass
    class Config:
        lr: float = 1e-3
        hidden: tuple = (64, 64)
        double: bool = True
        steps: int = 10

    cfg = apply_overrides(Config, {"lr": parse_value("3e-4"), "hidden": parse_value("32,32"),
                                   "double": parse_value("false"), "steps": parse_value("20")})
    assert (cfg.lr, cfg.hidden, cfg.double, cfg.steps) == (3e-4, (32, 32), False, 20)
    assert apply_overrides(Config, {"lr": 1}).lr == 1.0
    with pytest.raises(RlbenchError, match="did you mean 'lr'"):
        apply_overrides(Config, {"lrr": 0.1})
    with pytest.raises(RlbenchError, match="takes true or false"):
        apply_overrides(Config, {"double": 3})
    with pytest.raises(RlbenchError, match="takes a int"):
        apply_overrides(Config, {"steps": "many"})


class SmallMessages:
    """A plugin transport that declares what it can carry: 4,096 bytes a message, or no order."""

    @hookimpl
    def rlbench_register_transports(self, register):
        from rlbench.protocols import TransportCapabilities

        register("tiny", "rlbench.builtin.transports.tcp:TcpTransport",
                 capabilities=TransportCapabilities(max_message_bytes=4096, reliable=True, ordered=True,
                                                    crosses_processes=True, crosses_hosts=True))
        register("unordered", "rlbench.builtin.transports.tcp:TcpTransport",
                 capabilities=TransportCapabilities(max_message_bytes=1 << 20, reliable=True, ordered=False,
                                                    crosses_processes=True, crosses_hosts=True))


def test_a_transport_too_small_for_the_runs_largest_message_is_refused_before_anything_starts():
    from rlbench.runner import run

    registry, _ = plugins.build([("small", SmallMessages())], load_entry_points=False)
    # DQN's default 128-128 Q-network is 4*128 + 128 + 128*128 + 128 + 128*2 + 2 floats: ~70 KB of weights.
    config = RunConfig(placement="server", transport="tiny", actors=2, steps=500, eval_episodes=0)
    with pytest.raises(InvalidCombinationError, match=r"transport tiny carries at most 4,096 bytes per message, but "
                                                      r"this run's largest message, PARAMS \(the policy's weights\), "
                                                      r"is [\d,]+ bytes; transports that would work: shm, tcp, udp"):
        run(config, registry=registry)
    # a 4-4 network's weights fit; then the largest is a BATCH of 128 transitions, which does not
    small = RunConfig(placement="server", transport="tiny", hyperparameters={"hidden_sizes": [4, 4]})
    with pytest.raises(InvalidCombinationError, match="largest message, BATCH, is 7,872 bytes"):
        run(small, registry=registry)


class ExactMessages:
    """A plugin transport that carries exactly an unsharded run's largest message (a BATCH of 128
    transitions of a 4-4 network's run, 7,872 bytes), and a DQN without policy_shapes."""

    @hookimpl
    def rlbench_register_transports(self, register):
        from rlbench.protocols import TransportCapabilities

        register("exact", "rlbench.builtin.transports.tcp:TcpTransport",
                 capabilities=TransportCapabilities(max_message_bytes=7_872, reliable=True, ordered=True,
                                                    crosses_processes=True, crosses_hosts=True))

    @hookimpl
    def rlbench_register_algorithms(self, register):
        from rlbench.builtin import capabilities

        register("shapeless", WithoutPolicyShapes, capabilities=capabilities.DQN)


class WithoutPolicyShapes:
    """DQN as a third-party algorithm that does not say the shapes of the weights it publishes."""

    def __init__(self):
        from rlbench.algorithms.dqn import DQN

        self._dqn = DQN()
        self.name, self.Config, self.capabilities = "shapeless", self._dqn.Config, self._dqn.capabilities

    def make_actor(self, *args):
        return self._dqn.make_actor(*args)

    def make_learner(self, *args):
        return self._dqn.make_learner(*args)


SMALL_NETWORK = {"hidden_sizes": [4, 4]}  # its weights are small: the largest message is a BATCH of 128


def test_a_sharded_runs_batch_is_checked_with_the_priority_mass_its_shard_adds():
    from rlbench.runner import check

    registry, _ = plugins.build([("exact", ExactMessages())], load_entry_points=False)
    config = RunConfig(placement="server", transport="exact", actors=2, hyperparameters=SMALL_NETWORK)
    check(config, registry)  # 7,872 bytes: it fits exactly
    with pytest.raises(InvalidCombinationError, match="largest message, BATCH, is 7,920 bytes"):
        check(RunConfig(placement="server", transport="exact", actors=2, replay_shards=2,
                        hyperparameters=SMALL_NETWORK), registry)


def test_an_algorithm_without_policy_shapes_has_its_other_messages_checked_and_the_weights_noted():
    from rlbench.runner import check

    registry, _ = plugins.build([("exact", ExactMessages()), ("small", SmallMessages())], load_entry_points=False)
    with pytest.raises(InvalidCombinationError, match="largest message, BATCH, is 7,872 bytes"):
        check(RunConfig(algo="shapeless", placement="server", transport="tiny", actors=2,
                        hyperparameters=SMALL_NETWORK), registry)
    plan, _, _ = check(RunConfig(algo="shapeless", placement="server", transport="exact", actors=2,
                                 hyperparameters=SMALL_NETWORK), registry)
    assert plan.notes == ["the policy's weights were not checked against transport exact's max_message_bytes before "
                          "the start: algorithm shapeless does not give policy_shapes(spec, config) (the shapes of "
                          "the weights its learner publishes; docs/plugins.md, Algorithms); inserts and batches were"]
    plan, _, _ = check(RunConfig(placement="server", transport="exact", actors=2, hyperparameters=SMALL_NETWORK),
                       registry)
    assert plan.notes == []  # dqn gives its policy_shapes: everything was checked


class ThirdPartyAlgorithms:
    """Algorithms of a third party: the cpu backend lists none of their names. `declared` says what its
    roles need from a compute backend; `undeclared` does not."""

    @hookimpl
    def rlbench_register_algorithms(self, register):
        import dataclasses

        from rlbench.builtin import capabilities

        register("declared", DeclaredDQN, capabilities=DeclaredDQN.capabilities)
        register("undeclared", DeclaredDQN, capabilities=dataclasses.replace(capabilities.DQN, needs={}))

    @hookimpl
    def rlbench_register_compute_backends(self, register):
        register("tabular-engine", "x:y", capabilities=ComputeCapabilities(
            roles=frozenset(), provides=frozenset({"tabular"}), does_not="no neural networks"))


def _declared_dqn():
    from rlbench.algorithms.dqn import DQN
    from rlbench.protocols import AlgorithmCapabilities

    class DeclaredDQN(DQN):
        name = "declared"
        capabilities = AlgorithmCapabilities(
            action_space="discrete", observation_space="continuous", loop="replay", prioritized_replay=True,
            needs={"actor": {"mlp_inference"}, "learner": {"torch_device"}})

    return DeclaredDQN


DeclaredDQN = _declared_dqn()


def test_the_cpu_backend_runs_a_third_party_algorithm_that_declares_what_its_roles_need():
    registry, _ = plugins.build([("third", ThirdPartyAlgorithms())], load_entry_points=False)
    for placement, transport in (("local", "inproc"), ("server", "tcp")):
        validate(RunConfig(algo="declared", compute="cpu", placement=placement, transport=transport), registry)
    with pytest.raises(InvalidCombinationError, match="compute backend cpu cannot run the undeclared actor; "
                                                      "undeclared does not say what its actor needs"):
        validate(RunConfig(algo="undeclared", compute="cpu"), registry)


def test_needs_are_checked_against_what_a_backend_provides_and_named_when_missing():
    from rlbench.protocols import AlgorithmCapabilities

    with pytest.raises(ValueError, match="needs names \\['mlp'\\], which no compute backend provides"):
        AlgorithmCapabilities(action_space="discrete", observation_space="continuous", loop="replay",
                              needs={"actor": {"mlp"}})
    registry, _ = plugins.build([("third", ThirdPartyAlgorithms())], load_entry_points=False)
    with pytest.raises(InvalidCombinationError, match="compute backend tabular-engine cannot run the declared actor "
                                                      "\\(its actor needs mlp_inference, which tabular-engine does not "
                                                      "provide; no neural networks\\); compute backends that can: cpu"):
        validate(RunConfig(algo="declared", compute="tabular-engine"), registry)


def test_a_transport_that_may_reorder_is_refused_for_distributed_placements():
    registry, _ = plugins.build([("small", SmallMessages())], load_entry_points=False)
    with pytest.raises(InvalidCombinationError, match="transport unordered may reorder messages"):
        validate(RunConfig(placement="server", transport="unordered"), registry)
