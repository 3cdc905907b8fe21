"""N learners in data parallel: each samples its share of every batch from the replay node, and their
gradients are averaged with torch.distributed's all-reduce before every optimizer step, so all
learners hold the same parameters and the algorithm's work per env step is what the user set.

How, without changing the algorithm's code:
- Rendezvous: learner 0 opens a torch.distributed TCPStore on a free port of its host and announces
  it through its launcher (the same channel by which the replay node announces its address; on Ray,
  Ray carries it); the other learners join it. gloo on the CPU, NCCL when the learner is on CUDA.
- Gradients: every parameter an optimizer of the learner steps gets a post-accumulate-grad hook;
  when all of an optimizer's parameters have their gradient from a backward pass, one flat
  all-reduce averages them, before the algorithm's own gradient clipping and optimizer step (the
  order DistributedDataParallel keeps, by the same means: hooks in backward).
- Ending together: after drawing its batch (or END), each learner posts an asynchronous all-reduce
  of [alive, digest of its parameters]; the first gradient hook of the step waits for it. If a
  learner got END, every learner stops at that step (its batch is dropped) — no learner is left
  waiting in a collective.
- Identical parameters are measured, not assumed: every DIGEST_EVERY updates, and always after the
  last one (one more all-reduce when a learner got END), each learner hashes the bytes of its
  parameters; the all-reduce carries the hash in 16-bit pieces and their squares, and the pieces are
  equal on every learner exactly when world * sum(x^2) == sum(x)^2 (integers, exact in float64).
  A bit of difference anywhere is DIVERGED; a group that lost a learner before its final comparison
  says not checked (None), not identical.
- A learner lost mid-run: the survivors' collective fails (gloo sees the connection close; a
  timeout bounds the rest) and they end with that reason; the launcher stops the run (exit 1).

Default: one replay node that every learner samples (not a shard per learner): the sampling law
over all stored transitions (proportional prioritization included) is then the single learner's,
and the rate limiter counts every learner's samples; shards would need sampling across them in
proportion to their total priority (issue #24).
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import os
import socket
import struct
import time
from typing import Any

from rlbench.builtin import capabilities as caps
from rlbench.errors import InvalidCombinationError, RlbenchError

COLLECTIVE_TIMEOUT_S = 60.0  # a collective that cannot finish (a learner gone without a trace) fails after this
# Hashing every update would cost ~7 ms for the Atari CNN's 1.7M parameters (~0.1 ms for a small MLP): every
# 100th, and always after the last update (a divergence persists, so the final comparison catches any)
DIGEST_EVERY = 100
DIGEST_PIECES = 4  # 16-bit pieces of a 64-bit hash: their squares summed over the group stay exact in float64


def gloo_interface(store_host: str, port: int) -> str | None:
    """The interface this host reaches the store through, for gloo (GLOO_SOCKET_IFNAME while the group
    forms), unless the user chose one. Left alone, gloo binds to the address its host name resolves to: 127.0.0.1 or
    127.0.1.1 on many hosts (Debian's /etc/hosts), which a learner on another host or network namespace
    then dials, and the group never forms. None where no IPv4 interface holds that address."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((store_host, port))  # no datagram: the kernel only picks the route and source
            source = probe.getsockname()[0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as query:
            for _, name in socket.if_nameindex():
                request = struct.pack("256s", name.encode()[:15])
                try:
                    address = socket.inet_ntoa(fcntl.ioctl(query.fileno(), 0x8915, request)[20:24])  # SIOCGIFADDR
                except OSError:  # no IPv4 address on it
                    continue
                if address == source:
                    return name
    except OSError:  # an IPv6 store, or no route: gloo's own choice
        return None
    return None


class GroupEnded(RlbenchError):
    """Another learner of the group reached the end of the run: this one stops at the same step."""


class DataParallel:
    capabilities = caps.DATA_PARALLEL

    def check(self, config: Any, hp: Any) -> None:
        if config.learners < 1:
            raise InvalidCombinationError(f"--learners must be at least 1, got {config.learners}")
        if config.placement != "server":
            raise InvalidCombinationError(f"policy data-parallel runs its learners beside a replay node they sample "
                                          f"from: use --placement server (not {config.placement})")
        if hp.batch_size % config.learners:
            raise InvalidCombinationError(f"batch_size {hp.batch_size} does not split into {config.learners} equal "
                                          f"shares: choose --learners dividing it (the global batch stays the user's)")

    def learners(self, config: Any) -> int:
        return config.learners

    def learner_group(self, rank: int, world: int, rendezvous: str, host: str, announce: Any) -> "TorchLearnerGroup":
        return TorchLearnerGroup(rank, world, rendezvous, host, announce)


# What the group's collectives put on each learner's link. torch does not expose gloo's (or nccl's) own
# byte counters, so this is the algorithm's arithmetic, said as such: a ring all-reduce (gloo's default
# for CPU tensors, nccl's for these sizes) sends and receives 2 (W - 1) / W of the tensor on every rank;
# the broadcast that makes the start identical moves the parameters once to every other rank.
COLLECTIVE_BYTES_BASIS = ("modelled: a ring all-reduce moves 2(W-1)/W of each tensor each way per learner; the start's "
                          "broadcast, the parameters from learner 0 to each other")


class TorchLearnerGroup:
    """One learner's membership of the group (rlbench.protocols.LearnerGroup), on torch.distributed."""

    def __init__(self, rank: int, world: int, rendezvous: str, host: str, announce: Any) -> None:
        import torch.distributed as dist

        self.rank, self.world = rank, world
        self._dist = dist
        timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        if rank == 0:  # the store listens on a free port of this host, then says where
            self._store = dist.TCPStore(host, 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
            announce(f"{host}:{self._store.port}")
            store_host, port = host, self._store.port
        else:
            store_host, _, port = rendezvous.rpartition(":")
            store_host = store_host.strip("[]")
            self._store = dist.TCPStore(store_host, int(port), world, is_master=False, timeout=timeout)
        self._interface = gloo_interface(store_host, int(port))
        self._timeout = timeout
        self._backend = "gloo"
        self._joined = False
        self._optimizers: list[Any] = []
        self._parameters: list[list[Any]] = []  # per optimizer, the parameters it steps
        self._pending: list[set[int]] = []  # per optimizer, parameters whose gradient has not come this step
        self._step: Any = None  # the step's agreement: (work, tensor) of the posted all-reduce
        self._agreed = False
        self.allreduce_ns = 0  # time in gradient all-reduces, waits included
        self.agreement_ns = 0  # time waiting for the step agreement
        self.collectives = 0
        self.collective_bytes = {"sent": 0, "received": 0}  # on this learner's link (COLLECTIVE_BYTES_BASIS)
        self.updates = 0  # agreements every learner passed, so updates every learner made
        self.digests_compared = 0
        self.last_checked_update: int | None = None  # after how many updates the last digests were compared
        self.diverged_at: int | None = None  # the first such count at which they differed
        self.final_checked = False
        self.ended = ""

    # ------------------------------------------------------------------------------------ set-up
    def share(self, batch_size: int) -> int:
        return batch_size // self.world

    def attach(self, learner: Any) -> None:
        """Average the gradients of every optimizer the learner has (its torch.optim.Optimizer
        attributes, in definition order), from the start on identical parameters."""
        import torch

        self._optimizers = [value for value in vars(learner).values() if isinstance(value, torch.optim.Optimizer)]
        if not self._optimizers:
            raise RlbenchError(f"{type(learner).__name__} has no torch optimizer to average gradients for: "
                               "policy data-parallel needs a learner that trains with one")
        device = next(p for o in self._optimizers for g in o.param_groups for p in g["params"]).device
        self._backend = "nccl" if device.type == "cuda" else "gloo"
        # gloo reads its interface as the group forms; set only for that moment, so that processes this one
        # starts later (a Ray node, another run) do not inherit this run's interface
        chosen = os.environ.get("GLOO_SOCKET_IFNAME")
        if chosen is None and self._interface:
            os.environ["GLOO_SOCKET_IFNAME"] = self._interface
        try:
            self._dist.init_process_group(self._backend, store=self._store, rank=self.rank, world_size=self.world,
                                          timeout=self._timeout)
        finally:
            if chosen is None:
                os.environ.pop("GLOO_SOCKET_IFNAME", None)
        self._joined = True
        for index, optimizer in enumerate(self._optimizers):
            parameters = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
            self._parameters.append(parameters)
            self._pending.append(set())
            for parameter in parameters:
                parameter.register_post_accumulate_grad_hook(self._hook(index))
        with torch.no_grad():  # identical from the first update, whatever each process's seed did
            for parameters in self._parameters:
                for parameter in parameters:
                    self._dist.broadcast(parameter.data, src=0)
                    if self.rank == 0:
                        self.collective_bytes["sent"] += _nbytes(parameter.data) * (self.world - 1)
                    else:
                        self.collective_bytes["received"] += _nbytes(parameter.data)
        self._device = device

    # ------------------------------------------------------------------------------- every step
    def begin_step(self, alive: bool) -> None:
        """Post this learner's part of the step's agreement: whether it has a batch, and every
        DIGEST_EVERY updates a digest of its parameters (every learner counts the same updates, so all
        post one at the same step)."""
        import torch

        pieces = self._digest_pieces() if self.updates % DIGEST_EVERY == 0 else [0.0] * 2 * DIGEST_PIECES
        values = torch.tensor([1.0 if alive else 0.0, *pieces], dtype=torch.float64, device=self._device)
        self._step = (self._dist.all_reduce(values, async_op=True), values)
        self._reduced(values)
        self._agreed = False

    def _digest_pieces(self) -> list[float]:
        """A 64-bit hash of the bytes of every parameter, as DIGEST_PIECES 16-bit integers and their squares."""
        import torch

        digest = hashlib.blake2b(digest_size=2 * DIGEST_PIECES)
        with torch.no_grad():
            for parameters in self._parameters:
                for parameter in parameters:  # bytes, whatever the dtype: any differing bit differs
                    digest.update(parameter.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy().data)
        pieces = [float(int.from_bytes(digest.digest()[2 * i:2 * i + 2], "little")) for i in range(DIGEST_PIECES)]
        return pieces + [x * x for x in pieces]

    def _compare(self, summed: list[float]) -> None:
        """The group's sums of the digest pieces and their squares: equal pieces everywhere, or diverged."""
        totals, squares = (round(x) for x in summed[:DIGEST_PIECES]), (round(x) for x in summed[DIGEST_PIECES:])
        identical = all(self.world * square == total * total for total, square in zip(totals, squares))
        if not identical and self.diverged_at is None:
            self.diverged_at = self.updates
        self.digests_compared += 1
        self.last_checked_update = self.updates

    def _compare_final(self) -> None:
        """Every learner is here at the same agreement (the one that ended the run), after the same last
        update: compare the parameters that update left."""
        import torch

        values = torch.tensor(self._digest_pieces(), dtype=torch.float64, device=self._device)
        self._dist.all_reduce(values)
        self._reduced(values)
        self.collectives += 1
        self._compare(values.tolist())
        self.final_checked = True

    def _agree(self) -> None:
        """Wait for the step's agreement; raise GroupEnded when a learner has no batch."""
        if self._agreed:
            return
        started = time.perf_counter_ns()
        work, values = self._step
        work.wait()
        self.agreement_ns += time.perf_counter_ns() - started
        self.collectives += 1
        alive, *summed = values.tolist()
        self._agreed = True
        carried_digest = self.updates % DIGEST_EVERY == 0
        if carried_digest:
            self._compare(summed)
        if alive < self.world:
            if carried_digest:  # this agreement already compared the parameters the last update left
                self.final_checked = True
            else:
                self._compare_final()
            self.ended = "another learner reached the end of the run"
            raise GroupEnded(self.ended)
        self.updates += 1

    def _hook(self, index: int) -> Any:
        def averaged_when_complete(parameter: Any) -> None:
            pending = self._pending[index]
            if not pending:  # the first gradient of this optimizer's backward
                self._agree()
                pending.update(id(p) for p in self._parameters[index])
            pending.discard(id(parameter))
            if not pending:
                self._average(index)
        return averaged_when_complete

    def _average(self, index: int) -> None:
        import torch

        started = time.perf_counter_ns()
        grads = [p.grad for p in self._parameters[index]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._dist.all_reduce(flat)
        self._reduced(flat)
        flat.div_(self.world)
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()
        self.allreduce_ns += time.perf_counter_ns() - started
        self.collectives += 1

    def _reduced(self, tensor: Any) -> None:
        share = _nbytes(tensor) * 2 * (self.world - 1) // self.world
        self.collective_bytes["sent"] += share
        self.collective_bytes["received"] += share

    def leave(self) -> None:
        """This learner got END: its agreement says so (the others stop at this step too)."""
        if self._joined and self._step is not None and not self._agreed:
            try:
                self._agree()
            except GroupEnded:
                pass

    # ------------------------------------------------------------------------------------ after
    def report(self) -> dict[str, Any]:
        return {"policy": "data-parallel", "rank": self.rank, "world": self.world, "backend": self._backend,
                "allreduce_s": self.allreduce_ns / 1e9, "agreement_wait_s": self.agreement_ns / 1e9,
                "collectives": self.collectives, "collective_bytes": dict(self.collective_bytes),
                "collective_bytes_basis": COLLECTIVE_BYTES_BASIS, "parameters_identical": self.parameters_identical(),
                "digest_every": DIGEST_EVERY, "digests_compared": self.digests_compared,
                "last_checked_update": self.last_checked_update if self.final_checked else None,
                "diverged_at_update": self.diverged_at, "ended": self.ended}

    def parameters_identical(self) -> bool | None:
        """False once digests differed; True only when the parameters after the last update were compared
        too; None (not checked) when the group ended without that comparison (a learner was lost)."""
        if self.diverged_at is not None:
            return False
        return True if self.final_checked else None

    def close(self) -> None:
        if self._joined:
            try:
                self._dist.destroy_process_group()
            except Exception:  # a collective already failed: the group is gone either way
                pass
            self._joined = False


def _nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()
