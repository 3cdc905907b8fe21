"""Launchers: what starts a distributed run's roles, watches them and stops them (never carries data).

- `local` (local.py): each role a spawned process on this machine (the default).
- `ray` (ray.py): each role a Ray actor pinned to a node of a Ray cluster (rlbench.cluster has the
  cluster's own helpers: connecting, its nodes, namespace clusters for tests).

A launcher implements the `Launcher` protocol below: start a role from a `RoleSpec` of plain data
(rlbench.runtime.distributed.roles), tell the address a role announced (the replay node's; a
learner group's rendezvous), report liveness and each role's outcome, stop everything. What the
roles are and in which order they start is the driver's (rlbench.runtime.distributed.driver) and
the distribution policy's (rlbench.runtime.policies): a launcher knows neither. The driver also
chooses the launcher a run names (`make_launcher`).
"""

from __future__ import annotations

import ctypes
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from rlbench.registry import load_object
from rlbench.runtime.distributed import roles
from rlbench.runtime.distributed.roles import RoleSpec

ROLE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "replay": roles.replay_node_main,
    "learner": roles.learner_main,
    "actor": roles.actor_main,
}
POLL_S = 0.25
GRACE_S = 10.0  # after the run ended, how long roles get to flush, report and leave before they are killed
START_TIMEOUT_S = 120.0
ROLE_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the launcher stops roles, in order


def role_process_name(role: str, index: int) -> str:
    """The name a role process shows in /proc/PID/comm, ps and top (15 characters at most)."""
    return f"rlb-{roles.role_name(role, index)}"


def _linux_process_setup(name: str) -> None:
    """Name the process for ps/top, and have the kernel kill it if the launcher dies, so no role
    is ever orphaned (PR_SET_PDEATHSIG; SIGKILL, since roles leave the polite signals to the launcher)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_role(function: Callable[..., Any] | str, spec: RoleSpec, announce: Callable[[str], None]) -> Any:
    """What every launcher does in a role's process: signals left to the launcher (a scheduler's
    SIGTERM to the process group, or Ctrl-C, reaches the launcher, which stops roles in order), the
    process named, then the role. A cluster engine may run the role off the main thread (a Ray
    actor's); its processes are not in the launcher's process group, so they keep their handlers."""
    if threading.current_thread() is threading.main_thread():
        for signum in ROLE_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
    _linux_process_setup(role_process_name(spec.role, spec.index))
    target = load_object(function) if isinstance(function, str) else function
    return target(spec, announce=announce)


def called(handle: RoleHandle) -> str:
    """A role as a sentence names it: the replay node, learner-1."""
    return "the replay node" if handle.role == "replay" else handle.name


def listen_address(transport: Any, name: str, host: str) -> str | None:
    """Where a server role listens so that peers reach it at `host` (an IP or host name, `--bind` or
    its node's routable address). The rule for every transport: its own `listen_address(host)` when it
    defines one (returning None for "my default listener": e.g. dpdk's wire ports, placed by the
    --dpdk-port interface; raising AddressError when, as configured, it cannot be reached from another
    host); otherwise NAME://HOST:0 (any free port) for a transport that crosses hosts, whose addresses
    are HOST:PORT; otherwise None: a one-host transport listens where it always does."""
    own = getattr(transport, "listen_address", None)
    if own is not None:
        return own(host)
    if not transport.capabilities.crosses_hosts:
        return None
    return f"{name}://{f'[{host}]' if ':' in host else host}:0"


def one_line(text: str, limit: int = 300) -> str:
    """A reason for a human: one line, bounded."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


class RoleFailedError(RuntimeError):
    """A started role failed before the run could go on: the run stops (exit 1, its result says
    why). Not an RlbenchError: those are refusals before anything starts (exit 2)."""


@dataclass
class RoleHandle:
    role: str
    index: int
    process: Any

    @property
    def name(self) -> str:
        return roles.role_name(self.role, self.index)

    def alive(self) -> bool:
        return self.process.is_alive()

    def join(self, timeout: float) -> None:
        self.process.join(timeout=timeout)

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode


class Launcher(Protocol):
    """What a distributed run needs from whatever starts its roles. `LocalLauncher` spawns local
    processes; a cluster-engine launcher (Ray actors) implements the same calls."""

    handles: list[RoleHandle]  # every role started, for liveness and joins

    def start(self, spec: RoleSpec) -> RoleHandle: ...

    def wait_address(self, node: RoleHandle) -> str: ...

    def collect(self) -> dict[str, tuple[str, Any]]: ...

    def wait(self, handles: list[RoleHandle], timeout: float) -> None: ...

    def failure_of(self, handle: RoleHandle) -> str: ...

    def stop_all(self, grace: float = GRACE_S) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """For the result: the launcher, and where each role ran ({"roles": {name: {"host": ...}}})."""
        ...
