"""The contracts every component satisfies, whoever ships it.

Capabilities are plain frozen dataclasses declared at registration time, so the validator and
`rlbench list` can reason about a component without importing it (and so without torch, pyopencl
or DPDK). Behaviour is described with `typing.Protocol`; `rlbench.testing` checks it for real.

This module must stay import-light: no numpy, no torch at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

KINDS = ("transport", "replay", "compute", "environment", "algorithm", "policy")
PLACEMENTS = ("local", "server", "in-network")
LAUNCHERS = ("local", "ray")
PLACEABLE_ROLES = ("replay", "learner", "actors")
# --launcher ray --placement-strategy: the run's roles as bundles of one Ray placement group, placed
# with Ray's strategy of that name (pack -> PACK, strict-spread -> STRICT_SPREAD)
PLACEMENT_STRATEGIES = ("pack", "spread", "strict-pack", "strict-spread")


# --------------------------------------------------------------------------------------------
# Probes
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """Whether a component can run here, and if not, one line a user can act on."""

    available: bool
    reason: str = ""

    @classmethod
    def ok(cls, detail: str = "") -> "Probe":
        return cls(True, detail)

    @classmethod
    def missing(cls, reason: str) -> "Probe":
        return cls(False, reason)


def probe_modules(*modules: str, hint: str = "") -> Probe:
    """Available when every module can be found, without importing it (find_spec is cheap)."""
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return Probe.missing(f"python module {module!r} not installed" + (f": {hint}" if hint else ""))
    return Probe.ok()


# --------------------------------------------------------------------------------------------
# Capabilities, one dataclass per kind
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TransportCapabilities:
    max_message_bytes: int
    reliable: bool  # every message arrives, or the loss is detected and counted in stats["lost"]
    ordered: bool
    crosses_processes: bool
    crosses_hosts: bool
    zero_copy: bool = False  # receive hands out views of the medium's memory
    # its listeners keep peers not admitted yet apart (Listener: expect_admission, admit); the
    # conformance kit checks that a transport declaring it has them and that they work
    admission: bool = False


@dataclass(frozen=True)
class ReplayCapabilities:
    prioritized: bool
    max_item_bytes: int | None = None  # None: no limit beyond memory
    dtypes: tuple[str, ...] = ("float32", "float64", "int64", "int32", "uint8", "bool")
    device: str = "host"  # where the storage lives
    accepts_tensors: bool = False  # add/update_priorities take torch tensors (on its device), not only numpy
    # state_dict() -> {"arrays": {name: ndarray}, "meta": JSON-able} and load_state_dict(state): a
    # distributed run's checkpoint can hold it (--checkpoint-every)
    checkpoints: bool = False
    # priority_mass() -> (sum of priorities**alpha, the smallest non-zero one; uniform: size, 1.0): it
    # can be one shard of several (--replay-shards), the learner weighing shards by their mass
    shards: bool = False
    # the factory takes frames=k (rlbench.runtime.transitions.frames_of(spec)): obs and next_obs are
    # image observations of k frames on axis 0 (k = 1: the whole observation is one frame), and each
    # distinct frame is stored once, stacks rebuilt on sample exactly as they were added (Dopamine's
    # circular buffer, cpprb's stack_compress). Without it a memory stores obs and next_obs as given.
    frames: bool = False


# What a compute backend gives a role, by the names of the ComputeBackend methods that give it: the
# vocabulary of ComputeCapabilities.provides and AlgorithmCapabilities.needs.
COMPUTE_SERVICES = ("torch_device", "mlp_inference", "cnn_inference", "tabular")


# Role names for compute backends: "<algorithm>:<role>", role one of actor, learner, tabular.
@dataclass(frozen=True)
class ComputeCapabilities:
    roles: frozenset[str]
    device: str = "cpu"
    does_not: str = ""  # said plainly: what this backend cannot do
    # the networks its inference engines and learners' device run: "mlp" (mlp_inference) and "cnn"
    # (cnn_inference, rlbench.kit.networks.ConvNetSpec); a run on image observations needs "cnn"
    networks: frozenset[str] = frozenset({"mlp"})
    # what it gives any algorithm, COMPUTE_SERVICES names: it runs every role whose declared needs
    # (AlgorithmCapabilities.needs) it provides, whatever the algorithm is called, beside those `roles` names
    provides: frozenset[str] = frozenset()

    def supports(self, algorithm: str, role: str, needs: frozenset[str] | None = None) -> bool:
        """Whether it runs `role` of `algorithm`: named in `roles` ("<algorithm>:<role>" or
        "*:<role>"), or the role's declared `needs` (AlgorithmCapabilities.needs_of) are all provided."""
        return (f"{algorithm}:{role}" in self.roles or f"*:{role}" in self.roles
                or (needs is not None and needs <= self.provides))


SpaceKind = Literal["discrete", "continuous", "image"]  # image: uint8 frames (EnvSpec.observation_kind)


@dataclass(frozen=True)
class EnvironmentCapabilities:
    action_space: SpaceKind
    observation_space: SpaceKind
    max_episode_steps: int | None = None
    reward_threshold: float | None = None  # "solved" threshold, for time-to-threshold metrics
    device: str = "cpu"  # where the batched state lives
    aliases_to: str | None = None  # registered under an old id, runs the installed one
    # which suite it belongs to ("atari", "minatar", "mujoco", "classic-control", ...): an algorithm's
    # hyperparameter presets are chosen by it (Algorithm.presets)
    family: str = ""
    # its factory takes evaluation=True: episodes scored as the benchmark scores them (Atari: the raw
    # game score over all lives, where training clips rewards and ends an episode at each life lost)
    evaluation_mode: bool = False


@dataclass(frozen=True)
class PolicyCapabilities:
    """What a distribution policy (MSRL) does with a run: how many learners it may run, and whether
    its roles are separate processes around a replay node (`distributed`) or one process."""

    learners: Literal["one", "many"]
    distributed: bool
    placements: tuple[str, ...]  # the --placement values it runs with


@dataclass(frozen=True)
class AlgorithmCapabilities:
    action_space: SpaceKind
    # one kind, "any", or the kinds it takes (dqn: vectors and images)
    observation_space: SpaceKind | Literal["any"] | tuple[SpaceKind, ...]
    loop: Literal["replay", "tabular"]  # which runtime loop drives its actor and learner
    prioritized_replay: bool = False  # can use importance weights and return priorities
    offline: bool = False  # can learn from a collected dataset (--dataset N)
    roles: tuple[str, ...] = ("actor", "learner")
    placements: tuple[str, ...] = PLACEMENTS
    # its learner has state_dict() / load_state_dict(state) (torch values: networks, optimizers, its
    # update count), so a distributed run's checkpoint can hold it (--checkpoint-every)
    checkpoints: bool = False
    # what each role needs from a compute backend, COMPUTE_SERVICES names: {"actor": {"mlp_inference"},
    # "learner": {"torch_device"}}; any backend that provides them runs the role (ComputeCapabilities.
    # supports). Undeclared, only backends that list the algorithm's roles by name run it.
    needs: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown_roles = sorted(set(self.needs) - set(self.roles))
        if unknown_roles:
            raise ValueError(f"needs names roles {unknown_roles} that are not among the algorithm's roles "
                             f"{list(self.roles)}")
        needs = {role: frozenset(services) for role, services in self.needs.items()}
        unknown = sorted({service for services in needs.values() for service in services} - set(COMPUTE_SERVICES))
        if unknown:
            raise ValueError(f"needs names {unknown}, which no compute backend provides; choose from "
                             f"{', '.join(COMPUTE_SERVICES)}")
        object.__setattr__(self, "needs", needs)

    def needs_of(self, role: str) -> frozenset[str] | None:
        """What `role` needs from a compute backend, or None when the algorithm does not say."""
        return self.needs.get(role)

    def takes_observations(self, kind: str) -> bool:
        """Whether it learns from observations of this kind (discrete, continuous, image)."""
        space = self.observation_space
        return space == "any" or kind == space or (isinstance(space, tuple) and kind in space)


# --------------------------------------------------------------------------------------------
# Behaviour
# --------------------------------------------------------------------------------------------
Buffer = Any  # anything supporting the buffer protocol: bytes, bytearray, memoryview, numpy array


@runtime_checkable
class Connection(Protocol):
    """One side of a bidirectional, message-oriented link (what `Transport.connect` returns).

    The rules every transport keeps (`rlbench.testing.check_transport` checks each one):

    - A message is the concatenation of the parts given to `send`; it arrives whole or not at all,
      and in order. A transport that declares `reliable=False` may lose messages but never silently:
      each loss is counted in `stats["lost"]` (received + lost == sent).
    - `send` copies what it needs before it returns: the caller may change or reuse its buffers at
      once. A message larger than the working limit raises `MessageTooLargeError` (an RlbenchError
      and a ValueError) and the connection keeps working.
    - `recv(timeout)` returns a memoryview valid until the next `recv` on the same connection, or
      None when nothing arrived within `timeout` (None waits for ever). When the far side has closed
      or died, `recv` and `send` raise a ConnectionError (`rlbench.kit.framing.TransportClosedError`);
      so does a message over this side's receive limit, or a garbled one, after which the connection
      is closed.
    - `connect(address, timeout)` keeps trying while nothing listens yet and raises
      TransportClosedError when the timeout passes; a malformed address raises AddressError.
    - `request(*parts, timeout)` = send, then wait for one message; raises TimeoutError when none
      comes within `timeout`.
    - `close()` is harmless to call twice.
    """

    def send(self, *parts: Buffer) -> None: ...

    def recv(self, timeout: float | None = None) -> memoryview | None: ...

    def request(self, *parts: Buffer, timeout: float | None = None) -> memoryview:
        """send + wait for the reply in one call (one crossing into a native transport)."""
        ...

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages_sent, messages_received, bytes_sent, bytes_received, lost, ..."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Listener(Protocol):
    """The serving side: many peers connect to one address; replies go to a peer by its id.

    - A peer id is known from its first message on; `peers` lists the ids connected now.
      `send(peer, ...)` to an id it does not serve raises TransportClosedError naming the id.
    - Receiving enforces the listener's limit before allocating anything for a message, and memory
      follows the bytes that arrived, never a length the sender claims. A peer that sends more than
      the limit, garbles its framing, or stalls mid-message is dropped (or its message refused) and
      counted; every other peer goes on being served. Nothing a peer sends makes `recv` raise or
      wait on that peer.
    - `send(peer, ...)` never waits on that peer: what its medium cannot take now waits in the
      peer's queue (`rlbench.kit.framing.Outbox`) and goes out as the peer reads, during the
      listener's later `recv` and `send` calls. The queue is bounded by the factory option
      `max_queued_bytes` (default `MAX_QUEUED_BYTES`; a message into an empty queue is always taken):
      a peer whose queue would pass it is dropped, counted in `slow_consumers`, and that send raises
      `SlowConsumerError`. `recv` takes the peers' messages in turn: one peer's flood delays another
      peer's message by about one message, not by the flood.
    - `recv` and `send` on a closed listener raise ConnectionError; `close()` is harmless twice.
    - `stats` has at least messages_sent, messages_received, bytes_sent, bytes_received, lost, and
      the peer faults `refused_oversize`, `malformed`, `slow_consumers`, `dropped_peers`
      (`rlbench.kit.framing.PEER_FAULTS`).
    - Optional: `drop(peer)` closes one peer's connection (the replay node drops a peer that failed
      authentication, or that keeps sending before it authenticates). Without it such a peer stays
      connected, and the node reads and ignores what it sends (counted in `ignored_before_auth`).
    - Admission, where the transport's capabilities say `admission=True` (optional otherwise):
      `expect_admission(*, handshake_s, max_strangers)` switches it on (bad values raise
      RlbenchError) and `admit(peer)` marks a peer admitted (the replay node calls it when the peer
      has authenticated; harmless for a peer that is not a stranger). Until then a peer is a
      stranger, kept apart as a SYN queue is kept apart from established connections: at most
      `max_strangers` of them (a newcomer past that closes one: of those that never sent a message,
      the one that joined longest ago, else the one that spoke longest ago), one silent for
      `handshake_s` after it joined or not admitted `handshake_s` after it first spoke is closed,
      and a stranger never takes an admitted peer's place (a listener that bounds its peers turns a
      newcomer away rather than drop an admitted one). `stats` then also has `strangers_shed` and
      `handshake_timeouts`
      (`rlbench.kit.framing.ADMISSION_COUNTERS`; `rlbench.kit.framing.Strangers` keeps the books).
      Out of descriptors, a listener that accepts connections closes its oldest stranger to take the
      newcomer, and with none pauses accepting briefly (`ACCEPT_BACKOFF_S`) rather than spin.
    """

    address: str

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None: ...

    def send(self, peer: int, *parts: Buffer) -> None: ...

    @property
    def peers(self) -> Sequence[int]: ...

    @property
    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """A factory `factory(**options)` registered with TransportCapabilities. It may take
    `max_message_bytes=` (at most the registered capability) to work with a lower limit, both ways;
    the instance then has `.max_message_bytes`. `listen(None)` picks a local address (loopback for
    the kernel transports); `listener.address` is what `connect` takes.

    Optional: `listen_address(host) -> str | None`, where to listen so that peers on other hosts reach
    the listener at `host` (`--bind`, or its node's routable address under a cluster launcher); None
    means "my default listener"; AddressError when, as configured, it cannot be reached from another
    host (dpdk's memif port). Without it, a transport that crosses hosts listens on NAME://HOST:0."""

    capabilities: TransportCapabilities

    def listen(self, address: str | None = None) -> Listener: ...

    def connect(self, address: str, timeout: float = 10.0) -> Connection: ...


@dataclass
class Sample:
    indices: "np.ndarray"  # int64, positions in the memory, to pass back to update_priorities
    transitions: dict[str, "np.ndarray"]
    weights: "np.ndarray"  # float32 importance weights, max-normalised; ones when uniform


@runtime_checkable
class ReplayMemory(Protocol):
    """`factory(capacity, *, alpha, seed, **options)`. The rules (`rlbench.testing.check_replay_memory`):

    - The first `add` fixes the fields, dtypes and row shapes (`rlbench.kit.replay.TransitionLayout`);
      later batches must match. Refused input raises an RlbenchError (`rlbench.kit.replay.ReplayError`)
      with one line and leaves the memory as it was (a refused first batch fixes nothing).
    - FIFO: when full, the oldest items are overwritten; `add` returns the indices written.
    - `sample` draws with replacement; the same seed and calls give the same draws. Prioritized:
      P(i) = p_i**alpha / sum p**alpha, weights (N P(i))**-beta / max_j (N P(j))**-beta over the whole
      memory; uniform: weights of one. beta outside [0, 1], a batch < 1 or an empty memory are refused.
    - `update_priorities`: indices in [0, len), priorities finite and >= 0; an index given twice
      takes the last priority.
    - `stats()` is a JSON-able dict (size and capacity at least).
    A memory may carry `capabilities`; the runtime reads them from the registry entry.
    """

    capabilities: ReplayCapabilities
    capacity: int

    def __len__(self) -> int: ...

    def add(self, transitions: Mapping[str, "np.ndarray"], priorities: "np.ndarray | None" = None) -> "np.ndarray":
        """Store a batch (leading axis = items); new items get `priorities` or the max seen so far.
        Returns the indices written. Overwrites the oldest items when full (FIFO)."""
        ...

    def sample(self, batch_size: int, beta: float = 0.4) -> Sample: ...

    def update_priorities(self, indices: "np.ndarray", priorities: "np.ndarray") -> None: ...

    def stats(self) -> dict[str, Any]: ...


@runtime_checkable
class InferenceEngine(Protocol):
    """Batched forward pass of an MLP from published weights (an actor's policy).

    An engine that also takes torch tensors, and answers with tensors on their device, declares
    `accepts_tensors = True`; actors then keep a device-resident environment's data on the device.
    """

    def load(self, weights: Sequence["np.ndarray"], version: int) -> None:
        """weights: [W0, b0, W1, b1, ...] with W of shape (in, out)."""
        ...

    @property
    def version(self) -> int: ...

    def __call__(self, observations: "np.ndarray") -> "np.ndarray": ...


@runtime_checkable
class TabularEngine(Protocol):
    """A Q-table and the exact, in-order tabular TD update over batches of transitions."""

    q: "np.ndarray"  # (n_states, n_actions) float64 view of the current table

    def update(self, batch: Mapping[str, "np.ndarray"], *, rule: str, alpha: float, gamma: float) -> None:
        """rule 'qlearning' or 'sarsa' (sarsa reads batch['next_action']). Order within the batch is kept."""
        ...

    def fit_offline(self, dataset: Mapping[str, "np.ndarray"], *, rule: str, alpha: float, gamma: float,
                    epochs: int) -> dict[str, Any]:
        """Learn from a whole dataset (SwiftRL); returns what it measured/modelled (labelled)."""
        ...


@runtime_checkable
class ComputeBackend(Protocol):
    capabilities: ComputeCapabilities

    def torch_device(self) -> Any:
        """The torch.device learners of deep algorithms put their networks on."""
        ...

    def mlp_inference(self, layer_sizes: Sequence[int], *, hidden_activation: str = "relu",
                      output_activation: str = "identity") -> InferenceEngine: ...

    def tabular(self, n_states: int, n_actions: int) -> TabularEngine: ...

    # Backends whose capabilities list "cnn" in `networks` also give
    # `cnn_inference(network: rlbench.kit.networks.ConvNetSpec) -> InferenceEngine`: the forward pass of
    # a convolutional network from published weights (network.weight_shapes() says their order), on
    # observations of the network's input dtype (uint8 frames are cast and scaled on the engine's device).

    def fingerprint(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class EnvSpec:
    id: str
    num_envs: int
    observation_shape: tuple[int, ...]
    observation_dtype: str
    action_kind: SpaceKind
    n_actions: int | None = None  # discrete
    action_shape: tuple[int, ...] = ()
    action_low: tuple[float, ...] | None = None  # continuous
    action_high: tuple[float, ...] | None = None
    n_states: int | None = None  # discrete observations
    max_episode_steps: int | None = None
    reward_threshold: float | None = None
    note: str = ""  # e.g. which installed id an old id was mapped to
    # Image observations: how many frames are stacked on axis 0 of an observation (Atari: 4 of 84x84);
    # 0 when they are not stacked (MinAtar's channels) or not images
    frame_stack: int = 0
    # What an episode's return counts, when not the raw reward: Atari trains on rewards clipped to their
    # sign with an episode per life, and is evaluated on the raw game score (say which in results)
    returns: str = "raw"

    @property
    def observation_kind(self) -> SpaceKind:
        """discrete (a state index), image (uint8 frames of two or more dimensions) or continuous."""
        if self.n_states is not None:
            return "discrete"
        if self.observation_dtype == "uint8" and len(self.observation_shape) >= 2:
            return "image"
        return "continuous"


@dataclass
class StepResult:
    observations: "np.ndarray"  # after auto-reset, ready for the next action
    rewards: "np.ndarray"
    terminated: "np.ndarray"
    truncated: "np.ndarray"
    final_observations: "np.ndarray"  # the true next observation (differs where an episode ended)


@runtime_checkable
class Environment(Protocol):
    """A batch of `num_envs` environments with same-step auto-reset."""

    spec: EnvSpec

    def reset(self, seed: int | None = None) -> "np.ndarray": ...

    def step(self, actions: "np.ndarray") -> StepResult: ...

    def close(self) -> None: ...


@runtime_checkable
class Actor(Protocol):
    def act(self, observations: "np.ndarray", step: int) -> "np.ndarray":
        """Actions for a batch of observations; `step` is the global env step (for schedules)."""
        ...

    def greedy(self, observations: "np.ndarray") -> "np.ndarray": ...

    def load_weights(self, weights: Sequence["np.ndarray"], version: int) -> None: ...

    # Optional: `initial_priorities(transitions) -> np.ndarray`, the priorities an actor computes for
    # the transitions it inserts into a prioritized replay (Ape-X); without it new items get the max.


@runtime_checkable
class Learner(Protocol):
    updates: int
    # Learners of algorithms whose capabilities say `checkpoints` also give state_dict() and
    # load_state_dict(state): everything the next update depends on (rlbench/runtime/checkpoint.py).

    def update(self, sample: Sample) -> tuple["np.ndarray", dict[str, float]]:
        """One learning step on a sampled batch; returns new priorities (|TD error|) and metrics."""
        ...

    def weights(self) -> list["np.ndarray"]:
        """The actor-side policy weights, as published to actors: [W0, b0, ...], W (in, out)."""
        ...


@runtime_checkable
class Algorithm(Protocol):
    name: str
    Config: type  # dataclass of hyperparameters, every field with a default
    capabilities: AlgorithmCapabilities

    def make_actor(self, spec: EnvSpec, compute: ComputeBackend, config: Any, seed: int) -> Actor: ...

    def make_learner(self, spec: EnvSpec, compute: ComputeBackend, config: Any, seed: int) -> Learner: ...

    # Optional `presets: dict[family, dict[str, value]]`: hyperparameters for environments of a family
    # (EnvironmentCapabilities.family), applied before the run's own overrides (rlbench.config.run_hyperparameters).
    # Distributed algorithms also give `policy_shapes(spec, config) -> list[tuple[int, ...]]`: the shapes
    # of the weights the learner publishes ([W0, b0, ...]), without building anything, so the largest
    # message of a run is known before it starts (and a transport that cannot carry it is refused).
    # Without it the weights are left out of that check, and the run's result notes so (validate_messages).


@runtime_checkable
class LearnerGroup(Protocol):
    """What one learner of a policy with several learners does beside the algorithm's own update
    (`DistributionPolicy.learner_group`); the algorithm's code does not change."""

    rank: int
    world: int

    def share(self, batch_size: int) -> int:
        """This learner's part of every global batch (the replay ratio stays what the user set)."""
        ...

    def attach(self, learner: Any) -> None:
        """Join the learner's training to the group's (e.g. average its gradients across learners)."""
        ...

    def begin_step(self, alive: bool) -> None:
        """Before each update: whether this learner has a batch (`alive`); the group agrees on it, so
        every learner stops at the same step."""
        ...

    def leave(self) -> None:
        """The run is over for this learner: tell the others, who stop at their next step."""
        ...

    def report(self) -> dict[str, Any]:
        """JSON-able: what the group measured (its collectives' time, whether parameters stayed identical)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class DistributionPolicy(Protocol):
    """Where the parts of a run execute (MSRL, ATC'23): `factory()` returns one; capabilities:
    PolicyCapabilities. Launchers start the roles it asks for without knowing what it does inside
    them; the algorithm is the same under every policy. (`rlbench.testing.check_policy`)"""

    capabilities: PolicyCapabilities

    def check(self, config: Any, hp: Any) -> None:
        """Refuse, before a run starts, a run this policy cannot carry (an RlbenchError, one line)."""
        ...

    def learners(self, config: Any) -> int:
        """How many learner roles the run has."""
        ...

    def learner_group(self, rank: int, world: int, rendezvous: str, host: str, announce: Any) -> LearnerGroup | None:
        """In learner `rank`'s process: the group it trains in (None for one learner). Rank 0 listens
        on `host` and announces the rendezvous (`announce(address)`); the others get it as
        `rendezvous`."""
        ...


Factory = Callable[..., Any] | str
ProbeFn = Callable[[], Probe] | str
Capabilities = (TransportCapabilities | ReplayCapabilities | ComputeCapabilities | EnvironmentCapabilities
                | AlgorithmCapabilities | PolicyCapabilities)

CAPABILITY_TYPES: dict[str, type] = {
    "transport": TransportCapabilities,
    "replay": ReplayCapabilities,
    "compute": ComputeCapabilities,
    "environment": EnvironmentCapabilities,
    "algorithm": AlgorithmCapabilities,
    "policy": PolicyCapabilities,
}


@dataclass(frozen=True)
class RunOption:
    """A command-line option of `rlbench run` contributed by a plugin for one of its components."""

    kind: str
    component: str
    flag: str  # e.g. "--upmem-dpus"
    param: str  # keyword passed to the component's factory
    type: Any = str
    default: Any = None
    help: str = ""
    plugin: str = ""
    choices: tuple[str, ...] = field(default=())
