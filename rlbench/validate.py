"""Refuse an invalid combination before anything starts, saying what would work instead."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rlbench.config import ACTOR_COMPUTE, RunConfig, actor_compute_of, component_kind
from rlbench.errors import InvalidCombinationError, UnavailableComponentError, UnknownComponentError
from rlbench.protocols import LAUNCHERS, PLACEABLE_ROLES, PLACEMENTS
from rlbench.registry import Component, Registry, normalised

DEFAULT_REPLAY = "prioritized"


@dataclass
class Plan:
    """The components a valid configuration resolved to."""

    algorithm: Component
    environment: Component
    compute: Component
    replay: Component | None
    transport: Component | None
    policy: Component | None = None
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    actor_compute: Component | None = None  # the actors' backend where --actor-compute names another
    notes: list[str] = field(default_factory=list)  # what the checks could not check, for the run's result

    def selected(self) -> dict[str, Component]:
        """The components by kind; the actors' backend under "actor_compute" where it is not compute's
        (config.component_kind gives a key's registry kind)."""
        chosen = {"algorithm": self.algorithm, "environment": self.environment, "compute": self.compute}
        if self.actor_compute is not None:
            chosen[ACTOR_COMPUTE] = self.actor_compute
        if self.policy is not None:
            chosen["policy"] = self.policy
        if self.replay is not None:
            chosen["replay"] = self.replay
        if self.transport is not None:
            chosen["transport"] = self.transport
        return chosen


def _names_that_work(registry: Registry, kind: str, test) -> str:
    names = [c.name for c in registry.components(kind) if test(c)]
    return ", ".join(names) if names else "none registered"


def spans_hosts(config: RunConfig) -> bool:
    """Whether this run's roles may be on different hosts: a cluster launcher places them, and
    --bind listens for peers elsewhere."""
    return config.launcher != "local" or config.bind is not None


def _transports_that_work(registry: Registry, *, across_hosts: bool, test=lambda c: True) -> str:
    """What a refusal may suggest instead of a transport: only ones this run could use, i.e.
    available here, between processes, in order, across hosts where the run may span hosts, and
    passing `test`."""
    return _names_that_work(registry, "transport", lambda c: c.capabilities.crosses_processes and c.capabilities.ordered
                            and (c.capabilities.crosses_hosts or not across_hosts) and test(c) and c.probe().available)


def validate(config: RunConfig, registry: Registry) -> Plan:
    algorithm = registry.get("algorithm", config.algo)
    environment = registry.get("environment", config.env)
    compute = registry.get("compute", config.compute)
    caps = algorithm.capabilities
    env_caps = environment.capabilities
    name = algorithm.name

    for value, label in ((config.actors, "--actors"), (config.num_envs, "--num-envs"), (config.eval_episodes + 1, "--eval-episodes")):
        if value < 1:
            raise InvalidCombinationError(f"{label} must be at least {1 if label != '--eval-episodes' else 0}")
    if config.steps is not None and config.steps < 1:
        raise InvalidCombinationError("--steps must be at least 1")
    if config.seconds is not None and config.seconds <= 0:
        raise InvalidCombinationError("--seconds must be positive")

    if caps.action_space != env_caps.action_space:
        works = _names_that_work(registry, "environment", lambda c: c.capabilities.action_space == caps.action_space
                                 and caps.takes_observations(c.capabilities.observation_space))
        raise InvalidCombinationError(
            f"{name} needs a {caps.action_space} action space, but {environment.name} has a "
            f"{env_caps.action_space} one; environments that would work: {works}")
    if not caps.takes_observations(env_caps.observation_space):
        wanted = caps.observation_space if isinstance(caps.observation_space, str) else " or ".join(caps.observation_space)
        works = _names_that_work(registry, "environment", lambda c: caps.takes_observations(c.capabilities.observation_space)
                                 and c.capabilities.action_space == caps.action_space)
        raise InvalidCombinationError(
            f"{name} needs {wanted} observations, but {environment.name} has "
            f"{env_caps.observation_space} ones; environments that would work: {works}")
    _check_compute(compute, caps.roles, algorithm, environment, registry)
    actor_compute = _checked_actor_compute(config, registry, algorithm, environment)

    replay = None
    if caps.loop == "replay":
        replay = registry.get("replay", config.replay or DEFAULT_REPLAY)
    elif config.replay is not None:
        raise InvalidCombinationError(
            f"{name} updates its table from each transition in order and uses no replay memory; "
            f"drop --replay {config.replay}")

    if config.dataset is not None:
        if not caps.offline:
            offline = _names_that_work(registry, "algorithm", lambda c: c.capabilities.offline)
            raise InvalidCombinationError(f"{name} cannot learn from a dataset; algorithms that can: {offline}")
        if config.dataset < 1:
            raise InvalidCombinationError("--dataset must be at least 1 transition")

    if config.placement not in PLACEMENTS:
        raise InvalidCombinationError(f"unknown placement {config.placement!r}; choose one of {', '.join(PLACEMENTS)}")
    if config.placement not in caps.placements:
        raise InvalidCombinationError(
            f"{name} runs with placement {' or '.join(caps.placements)} only (it has no separate replay node)")
    if config.actor_restarts < 0:
        raise InvalidCombinationError(f"--actor-restarts must be at least 0, got {config.actor_restarts}")
    if config.actor_restarts and config.placement == "local":
        raise InvalidCombinationError("--actor-restarts replaces actor processes of a distributed run; placement local "
                                      "has none (use --placement server or in-network)")
    if config.placement == "local" and config.actors > 1:
        raise InvalidCombinationError(
            "placement local runs one actor inside the learner's process; use --num-envs for more "
            "environments, or --placement server / in-network for several actor processes")
    transport = None
    if config.placement != "local":
        transport = registry.get("transport", config.transport)
        works = _transports_that_work(registry, across_hosts=spans_hosts(config))
        if not transport.capabilities.crosses_processes:
            raise InvalidCombinationError(
                f"transport {transport.name} stays inside one process, but placement {config.placement} with "
                f"{config.actors} actor(s) runs roles as separate processes; transports that would work: {works}")
        if config.bind is not None and not transport.capabilities.crosses_hosts:
            raise InvalidCombinationError(f"--bind {config.bind}: transport {transport.name} stays on one host and "
                                          f"listens where it always does; transports that would work: {works}")
        if not transport.capabilities.ordered:
            raise InvalidCombinationError(
                f"transport {transport.name} may reorder messages, and the replay protocol needs each connection's "
                f"messages in order (a newer weights version must not be overtaken by an older one); transports "
                f"that would work: {works}")

    _check_launcher(config)
    _check_checkpoints(config, registry, algorithm, replay)
    _check_shards(config, registry, replay)
    policy = _checked_policy(config, registry)
    plan = Plan(algorithm, environment, compute, replay, transport, policy, actor_compute=actor_compute)
    _check_options(config, registry, plan)

    for kind, component in plan.selected().items():
        probe = component.probe()
        if not probe.available:
            what = "--actor-compute" if kind == ACTOR_COMPUTE else kind
            raise UnavailableComponentError(
                f"{what} {component.name!r} (plugin {component.plugin}) is unavailable here: {probe.reason}")
    _check_listening_host(config, plan)
    return plan


def _check_listening_host(config: RunConfig, plan: Plan) -> None:
    """A replay node that listens for other hosts (--bind, or a cluster launcher's on its node's routable
    address) needs a transport that, as configured, agrees to listen there: its listen_address raises
    AddressError saying why not and what to change (udp off loopback untrusted, dpdk's memif port)."""
    if plan.transport is None or not spans_hosts(config):
        return
    from rlbench.kit.framing import AddressError
    from rlbench.runtime.launchers import listen_address

    transport = plan.transport.create(**plan.options.get("transport", {}))
    # a cluster launcher's node address is known once placed; the wildcard stands for any off loopback
    host = config.bind if config.bind is not None else "0.0.0.0"
    try:
        listen_address(transport, plan.transport.name, host)
    except AddressError as exc:
        where = f"--bind {config.bind}" if config.bind is not None else f"--launcher {config.launcher}"
        raise InvalidCombinationError(f"{where}: {exc}") from None


def _check_compute(compute: Component, roles: tuple[str, ...], algorithm: Component, environment: Component,
                   registry: Registry, flag: str = "compute backend") -> None:
    """`compute` runs each of `roles` of `algorithm` (by name, or providing what the algorithm says
    each role needs), and a CNN where the environment's observations are images; refused with the
    backends that would."""
    algo, caps = algorithm.name, algorithm.capabilities

    def works(c: Component) -> bool:
        return (all(c.capabilities.supports(algo, r, caps.needs_of(r)) for r in roles)
                and (environment.capabilities.observation_space != "image" or "cnn" in c.capabilities.networks))

    if environment.capabilities.observation_space == "image" and "cnn" not in compute.capabilities.networks:
        networks = sorted(compute.capabilities.networks)
        runs = f"runs {' and '.join(networks)} only" if networks else "runs no network"
        raise InvalidCombinationError(
            f"{environment.name} has image observations, which {algo} learns with a convolutional network, but "
            f"{flag} {compute.name} {runs} ({compute.capabilities.does_not or 'no convolution'}); "
            f"compute backends that run a CNN: {_names_that_work(registry, 'compute', works)}")
    for role in roles:
        needs, provides = caps.needs_of(role), compute.capabilities.provides
        if not compute.capabilities.supports(algo, role, needs):
            detail = f" ({compute.capabilities.does_not})" if compute.capabilities.does_not else ""
            if provides and needs is not None:  # what is missing, where the backend says what it provides
                detail = (f" (its {role} needs {', '.join(sorted(needs - provides))}, which {compute.name} does not "
                          f"provide{'; ' + compute.capabilities.does_not if compute.capabilities.does_not else ''})")
            elif provides:
                detail += (f"; {algo} does not say what its {role} needs from a compute backend: declare it, e.g. "
                           f"AlgorithmCapabilities(needs={{'{role}': {{'mlp_inference'}}}}), and any backend that "
                           "provides it runs the role")
            raise InvalidCombinationError(
                f"{flag} {compute.name} cannot run the {algo} {role}{detail}; "
                f"compute backends that can: {_names_that_work(registry, 'compute', works)}")


def _checked_actor_compute(config: RunConfig, registry: Registry, algorithm: Component,
                           environment: Component) -> Component | None:
    """--actor-compute: the backend of the actors' inference, where it is not --compute's (None when it is).
    The actors are processes of their own only in a distributed run; the learner's backend still
    runs every role it did (the final greedy evaluation is an actor on it)."""
    if config.actor_compute is None:
        return None
    try:
        backend = registry.get("compute", config.actor_compute)
    except UnknownComponentError as exc:  # the registry names --compute; this is the other flag
        raise UnknownComponentError(str(exc).replace("for --compute", "for --actor-compute", 1)) from None
    if backend is registry.get("compute", config.compute):
        return None
    if "actor" not in algorithm.capabilities.roles:
        raise InvalidCombinationError(
            f"--actor-compute {backend.name}: {algorithm.name} has no actor role of its own (it runs "
            f"{', '.join(algorithm.capabilities.roles)} on --compute {config.compute})")
    if config.placement == "local":
        raise InvalidCombinationError(
            f"--actor-compute {backend.name}: placement local runs the actor inside the learner's process, on "
            f"--compute {config.compute}; use --placement server or in-network for actor processes on a backend "
            f"of their own, or drop --actor-compute")
    _check_compute(backend, ("actor",), algorithm, environment, registry, flag="--actor-compute")
    return backend


def _checked_policy(config: RunConfig, registry: Registry) -> Component:
    """The run's distribution policy, refused where it cannot carry the placement or learner count."""
    policy = registry.get("policy", config.policy)  # unknown names: did you mean
    if config.learners < 1:
        raise InvalidCombinationError(f"--learners must be at least 1, got {config.learners}")
    caps = policy.capabilities
    if config.placement not in caps.placements:
        works = _names_that_work(registry, "policy", lambda c: config.placement in c.capabilities.placements)
        raise InvalidCombinationError(
            f"policy {policy.name} runs with placement {' or '.join(caps.placements)}, not {config.placement}; "
            f"policies that run with {config.placement}: {works}")
    if config.learners > 1 and caps.learners == "one":
        works = _names_that_work(registry, "policy", lambda c: c.capabilities.learners == "many")
        raise InvalidCombinationError(f"policy {policy.name} runs one learner, not --learners {config.learners}; "
                                      f"policies with several: {works}")
    return policy


def validate_policy(config: RunConfig, plan: Plan, hp: Any) -> None:
    """What the policy itself refuses once the hyperparameters are known (e.g. a batch that does not
    split into its learners' shares)."""
    plan.policy.create().check(config, hp)


def _check_checkpoints(config: RunConfig, registry: Registry, algorithm: Component, replay: Component | None) -> None:
    """--checkpoint-every and --resume: a distributed run whose learner and replay memory can be saved."""
    if config.checkpoint_every is None and config.resume is None:
        if config.checkpoint_dir is not None:
            raise InvalidCombinationError("--checkpoint-dir says where --checkpoint-every writes; give that too")
        return
    flag = "--resume" if config.resume is not None else "--checkpoint-every"
    if config.checkpoint_every is not None and not (config.checkpoint_every > 0 and math.isfinite(config.checkpoint_every)):
        raise InvalidCombinationError(f"--checkpoint-every takes a positive number of seconds, got {config.checkpoint_every}")
    if config.placement == "local":
        raise InvalidCombinationError(f"{flag} checkpoints a distributed run's learner and replay node; placement local "
                                      "has neither as a process of its own (use --placement server or in-network)")
    if not algorithm.capabilities.checkpoints:
        works = _names_that_work(registry, "algorithm", lambda c: c.capabilities.checkpoints)
        raise InvalidCombinationError(f"{flag}: {algorithm.name}'s learner cannot be checkpointed (no state_dict); "
                                      f"algorithms that can: {works}")
    if replay is not None and not replay.capabilities.checkpoints:
        works = _names_that_work(registry, "replay", lambda c: c.capabilities.checkpoints)
        raise InvalidCombinationError(f"{flag}: replay memory {replay.name} cannot be checkpointed (no state_dict); "
                                      f"replay memories that can: {works}")


def _check_shards(config: RunConfig, registry: Registry, replay: Component | None) -> None:
    """--replay-shards: several replay nodes, sampled by the learner across them."""
    if config.replay_shards < 1:
        raise InvalidCombinationError(f"--replay-shards must be at least 1, got {config.replay_shards}")
    if config.replay_shards == 1:
        return
    if config.placement != "server":
        raise InvalidCombinationError(
            f"--replay-shards {config.replay_shards} runs with --placement server only: the learner draws each batch "
            "across the shards by their priority mass" + (" (placement local has no replay node)"
                                                          if config.placement == "local" else
                                                          ", where in-network has one node push batches ahead of demand"))
    if config.replay_shards > config.actors:
        raise InvalidCombinationError(f"--replay-shards {config.replay_shards} with --actors {config.actors}: each shard "
                                      "stores what the actors hashed to it insert, so every shard needs an actor")
    if replay is not None and not replay.capabilities.shards:
        works = _names_that_work(registry, "replay", lambda c: c.capabilities.shards)
        raise InvalidCombinationError(f"--replay-shards: replay memory {replay.name} does not say its priority mass "
                                      f"(priority_mass), so batches cannot be drawn across shards by it; replay "
                                      f"memories that can: {works}")


def _check_launcher(config: RunConfig) -> None:
    if config.launcher not in LAUNCHERS:
        raise InvalidCombinationError(f"unknown launcher {config.launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    if config.launcher != "local" and config.placement == "local":
        raise InvalidCombinationError(f"--launcher {config.launcher} starts the roles of a distributed run; with "
                                      "--placement local there are none (use --placement server or in-network)")
    if config.launcher != "ray" and (config.ray_address or config.place):
        raise InvalidCombinationError("--ray-address and --place are for --launcher ray")
    unknown = sorted(set(config.place) - set(PLACEABLE_ROLES))
    if unknown:
        raise InvalidCombinationError(f"--place {unknown[0]}=...: roles that can be placed are {', '.join(PLACEABLE_ROLES)}")
    if config.bind is not None and config.placement == "local":
        raise InvalidCombinationError("--bind is for the replay node of a distributed run (--placement server or in-network)")
    _check_placement_strategy(config)


def _check_placement_strategy(config: RunConfig) -> None:
    """--placement-strategy: a known Ray strategy, for --launcher ray, and not with --place actors (both
    would say where the actors go)."""
    import difflib

    from rlbench.protocols import PLACEMENT_STRATEGIES

    strategy = config.placement_strategy
    if strategy is None:
        return
    if strategy not in PLACEMENT_STRATEGIES:
        close = difflib.get_close_matches(str(strategy).lower().replace("_", "-"), PLACEMENT_STRATEGIES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InvalidCombinationError(f"unknown --placement-strategy {strategy!r}; {hint}choose one of "
                                      f"{', '.join(PLACEMENT_STRATEGIES)}")
    if config.launcher != "ray":
        raise InvalidCombinationError(f"--placement-strategy {strategy} reserves the run's roles as bundles of a Ray "
                                      f"placement group; it is for --launcher ray, not --launcher {config.launcher}")
    if "actors" in config.place:
        raise InvalidCombinationError(f"--placement-strategy {strategy} places the actors in the run's placement group; "
                                      "drop --place actors=... (--place replay=... and learner=... pin their bundles)")


def check_hosts(plan: Plan, registry: Registry, hosts: list[str], unreachable: str = "") -> None:
    """Roles on different hosts need a transport that crosses hosts: the registered capability, and
    the transport as this run configures it (`unreachable`: why its listener cannot be reached from
    another host, e.g. dpdk's memif port). Called by a launcher once it knows where roles will run."""
    distinct = sorted(set(hosts))
    if len(distinct) < 2:
        return
    transport = plan.transport
    works = _transports_that_work(registry, across_hosts=True)
    spread = f"this run places roles on {len(distinct)} hosts ({', '.join(distinct)})"
    if not transport.capabilities.crosses_hosts:
        raise InvalidCombinationError(f"transport {transport.name} stays on one host, but {spread}; "
                                      f"transports that cross hosts: {works}")
    if unreachable:
        raise InvalidCombinationError(f"transport {transport.name} as configured cannot link hosts ({unreachable}), "
                                      f"but {spread}; transports that cross hosts: {works}")


def selected_names(config: RunConfig) -> dict[str, str | None]:
    """The component name a configuration selects for each kind (the replay default included)."""
    return {"algorithm": config.algo, "environment": config.env, "compute": config.compute,
            ACTOR_COMPUTE: config.actor_compute if actor_compute_of(config) != config.compute else None,
            "replay": config.replay or DEFAULT_REPLAY, "transport": config.transport}


def options_from_flags(values: dict[str, Any], config: RunConfig, registry: Registry) -> dict[str, dict[str, Any]]:
    """Plugins' run options given by flag (`--upmem-dpus`, or `upmem-dpus` in a run file) as RunConfig.options
    ({kind: {param: value}}). A flag belongs to one component: it is refused when the run selects
    another, even where two components name their parameter alike."""
    options: dict[str, dict[str, Any]] = {}
    names = selected_names(config)
    for flag, value in values.items():
        option = _option_for(flag, registry)
        key = next((key for key, chosen in names.items() if component_kind(key) == option.kind and chosen is not None
                    and registry.get(option.kind, chosen).name == option.component), None)
        if key is None:
            raise InvalidCombinationError(f"{option.flag} applies to {option.kind} {option.component}, "
                                          "which this run does not use")
        options.setdefault(key, {})[option.param] = value
    return options


def _option_for(flag: str, registry: Registry) -> Any:
    wanted = "--" + flag.lstrip("-")
    for option in registry.run_options:
        if normalised(option.flag) == normalised(wanted):  # one namespace: case and '-'/'_' aside
            return option
    import difflib

    flags = [o.flag for o in registry.run_options]
    close = difflib.get_close_matches(wanted, flags, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; plugins' options: {', '.join(flags) or 'none'}"
    raise InvalidCombinationError(f"unknown run option {wanted}{hint}")


def _check_options(config: RunConfig, registry: Registry, plan: Plan) -> None:
    """Plugin options are only accepted for the component they belong to (matched by kind, the
    selected component and the parameter, so two components may name a parameter alike)."""
    selected = plan.selected()
    for kind, values in config.options.items():
        chosen = selected.get(kind)
        for param in values:
            owner = next((o for o in registry.run_options if o.kind == component_kind(kind) and o.param == param
                          and chosen is not None and o.component == chosen.name), None)
            if owner is None:
                others = [o for o in registry.run_options if o.kind == component_kind(kind) and o.param == param]
                if others:
                    raise InvalidCombinationError(" and ".join(o.flag for o in others)
                                                  + (" applies to " if len(others) == 1 else " apply to ")
                                                  + " and ".join(f"{o.kind} {o.component}" for o in others)
                                                  + ", which this run does not use")
                raise InvalidCombinationError(f"{kind} {chosen.name if chosen else '-'} takes no option {param!r}")
            plan.options.setdefault(kind, {})[param] = values[param]


def validate_hyperparameters(hp: Any) -> None:
    """Refuse hyperparameters that cannot work together, before anything starts."""
    from rlbench.algorithms.common import ReplayLoopConfig

    if not isinstance(hp, ReplayLoopConfig):
        return
    for name in ("buffer_size", "batch_size", "train_every", "publish_every"):
        if getattr(hp, name) < 1:
            raise InvalidCombinationError(f"hyperparameter {name} must be at least 1, got {getattr(hp, name)}")
    if hp.learning_starts > hp.buffer_size:
        raise InvalidCombinationError(
            f"learning_starts ({hp.learning_starts:,}) exceeds buffer_size ({hp.buffer_size:,}): the replay memory "
            "could never hold enough transitions for the learner to start; raise buffer_size or lower learning_starts")
    if hp.batch_size > hp.buffer_size:
        raise InvalidCombinationError(f"batch_size ({hp.batch_size:,}) exceeds buffer_size ({hp.buffer_size:,})")


def validate_messages(config: RunConfig, plan: Plan, algorithm: Any, hp: Any, registry: Registry) -> None:
    """Refuse, before any role starts, a transport that cannot carry the run's largest message (the
    policy's weights, a batch, an insert: an image run's framed, a sharded run's batch with its
    shard's priority mass, messages.largest_message), or, in network, cannot hold the batches the
    node pushes ahead of the learner (PUSH_CREDIT of them wait for it at most: a listener drops a
    peer whose queue passes max_queued_bytes). Builds one environment to learn its shapes. An
    algorithm without `policy_shapes` has its weights left out of the check, and the plan's notes
    say so (the run's result carries them)."""
    if plan.transport is None:
        return
    from rlbench.runtime import transitions
    from rlbench.runtime.distributed import messages, roles

    env = plan.environment.create(num_envs=1, seed=config.seed, **plan.options.get("environment", {}))
    try:
        spec = env.spec
    finally:
        env.close()
    policy_shapes = getattr(algorithm, "policy_shapes", None)
    if policy_shapes is None:
        plan.notes.append(
            f"the policy's weights were not checked against transport {plan.transport.name}'s max_message_bytes "
            f"before the start: algorithm {plan.algorithm.name} does not give policy_shapes(spec, config) (the "
            "shapes of the weights its learner publishes; docs/plugins.md, Algorithms); inserts and batches were")
    what, size = messages.largest_message(spec, policy_shapes(spec, hp) if policy_shapes is not None else None,
                                          insert_rows=roles.ACTOR_INSERT_TRANSITIONS, batch_size=hp.batch_size,
                                          frames=transitions.frames_of(spec), shards=config.replay_shards)
    capability = plan.transport.capabilities.max_message_bytes
    # the limit the run will use: its roles build the transport with the run's options, as here
    transport = plan.transport.create(**plan.options.get("transport", {}))
    limit = min(capability, int(getattr(transport, "max_message_bytes", capability)))
    name = plan.transport.name
    if size > limit:
        works = _transports_that_work(registry, across_hosts=spans_hosts(config),
                                      test=lambda c: c.capabilities.max_message_bytes >= size
                                      and c is not plan.transport)
        if limit < capability:
            raise InvalidCombinationError(
                f"transport {name} as configured carries at most {limit:,} bytes per message (max_message_bytes="
                f"{limit:,}), but this run's largest message, {what}, is {size:,} bytes; raise "
                f"{_flag_of(registry, name, 'max_message_bytes')} to at least {size:,} (it can carry {capability:,}), "
                f"or use a transport that would work: {works}")
        raise InvalidCombinationError(
            f"transport {name} carries at most {limit:,} bytes per message, but this run's largest "
            f"message, {what}, is {size:,} bytes; transports that would work: {works}")
    queued = getattr(transport, "max_queued_bytes", None)
    if config.placement == "in-network" and queued is not None:
        batch = messages.message_sizes(spec, [], insert_rows=1, batch_size=hp.batch_size,
                                       shards=config.replay_shards)["BATCH"]
        pushed = roles.PUSH_CREDIT * batch
        if pushed > queued:
            raise InvalidCombinationError(
                f"in network, the replay node pushes up to {roles.PUSH_CREDIT} batches of {batch:,} bytes ahead of the "
                f"learner, but transport {name} holds at most {queued:,} bytes for a peer that has not read yet "
                f"(max_queued_bytes) and would drop the learner; raise {_flag_of(registry, name, 'max_queued_bytes')} "
                f"to at least {pushed:,}, lower batch_size, or use --placement server")


def _flag_of(registry: Registry, transport: str, param: str) -> str:
    """The run option that sets a transport's parameter, or the parameter's name where none does."""
    flags = [o.flag for o in registry.options_for("transport", transport) if o.param == param]
    return flags[0] if flags else f"its {param}"
