"""A Ray cluster as rlbench sees it: connect (or start Ray for one run), its alive nodes, and the
names a user gives them (an IP, a node id or its prefix, a host name, a custom resource, a label)."""

from __future__ import annotations

import difflib
import logging
import os
import signal
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rlbench.builtin.capabilities import RAY_REQUIREMENT
from rlbench.builtin.transports.ray_actors import SMALL_OBJECT_STORE_BYTES, quiet_token_notice
from rlbench.errors import InvalidCombinationError, RlbenchError
from rlbench.runtime.launchers import one_line

INSTALL_HINT = f"pip install {RAY_REQUIREMENT}"
NAMESPACE = "rlbench"
RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
RAYLET_PROBE_S = 0.5  # how long a listed node's raylet has to accept a connection (alive_nodes)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RlbenchError(f"--launcher ray needs Ray, which is not installed here: {INSTALL_HINT}") from None
    return ray


# ------------------------------------------------------------------------------------- the cluster
@dataclass(frozen=True)
class Node:
    """An alive Ray node as `ray.nodes()` describes it."""

    node_id: str
    ip: str
    hostname: str
    resources: dict[str, float]
    labels: dict[str, str]
    manager_port: int = 0  # its raylet's port (0: not listed): raylet_answers asks it

    @property
    def cpus(self) -> float:
        return self.resources.get("CPU", 0.0)

    @property
    def gpus(self) -> float:
        return self.resources.get("GPU", 0.0)

    @property
    def custom_resources(self) -> list[str]:
        return sorted(r for r in self.resources if r not in RESERVED_RESOURCES and not r.startswith("node:"))

    def __str__(self) -> str:
        return f"node {self.ip} (id {self.node_id[:12]})"


def alive_nodes(ray: Any) -> list[Node]:
    """Ray's alive nodes, less those whose raylet no longer answers. A node restarted on a host stays
    listed alive under its old id until Ray's health checks say otherwise (seconds to a minute), and
    `--place IP` resolved to that id was refused; so where nodes share an address, each is asked."""
    listed = [Node(n["NodeID"], n["NodeManagerAddress"], n.get("NodeManagerHostname", ""), dict(n.get("Resources", {})),
                   dict(n.get("Labels") or {}), int(n.get("NodeManagerPort") or 0))
              for n in ray.nodes() if n.get("Alive")]
    sharing = Counter(node.ip for node in listed)
    live = [node for node in listed if sharing[node.ip] == 1 or raylet_answers(node)]
    return live or listed  # (none answering: a port this host cannot reach, not every node dead)


def raylet_answers(node: Node) -> bool:
    """Whether the node's raylet accepts a connection (True where its port is not known): a node Ray
    lists as alive may have been lost seconds ago."""
    if not node.manager_port:
        return True
    try:
        with socket.create_connection((node.ip, node.manager_port), timeout=RAYLET_PROBE_S):
            return True
    except OSError:
        return False


def connect(ray: Any, address: str | None, cpus_needed: int) -> bool:
    """Join the cluster at `address` ("auto", "HOST:PORT"), or start a Ray instance on this machine
    for the run (None). True when this call connected (the caller disconnects at the end); a process
    already connected (a test, a notebook) keeps its connection. Ray's driver start-up replaces the
    SIGTERM handler; the run's own (stop in order, write the result) is put back."""
    if ray.is_initialized():
        return False
    if isinstance(address, str) and address.startswith("ray://"):
        raise RlbenchError("--ray-address ray://... (Ray Client) is not supported: rlbench's launcher talks to the "
                           "replay node over the run's transport, so run rlbench on a node of the cluster with "
                           "--ray-address auto (or HEAD_IP:PORT)")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if on_main else None
    options: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:  # a Ray of our own: enough logical CPUs for every role, a small object store
        options.update(address="local", num_cpus=max(os.cpu_count() or 1, cpus_needed), include_dashboard=False,
                       object_store_memory=SMALL_OBJECT_STORE_BYTES)
    else:
        options["address"] = address
    try:
        with quiet_token_notice():
            ray.init(**options)
    except Exception as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        if _token_refused(exc):
            raise RlbenchError(f"cannot connect to {where}: Ray's token authentication refused this process: "
                               f"{_token_advice()}") from None
        if not isinstance(exc, (ConnectionError, RuntimeError, ValueError)):
            raise
        raise RlbenchError(f"cannot connect to {where}: {one_line(exc)}") from None
    finally:
        if on_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return True


def _token_refused(exc: BaseException | None) -> bool:
    """Whether Ray's token authentication refused this process (Ray 2.60: an AuthenticationError, or
    ray.init's ConnectionError caused by one, after its ~20 s of retries)."""
    while exc is not None:
        if type(exc).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _token_advice() -> str:
    """Why this process's Ray token was refused, as far as this node can tell, and the fix."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        lacks = "RAY_AUTH_MODE is not token here, so no token was sent"
    elif os.environ.get("RAY_AUTH_TOKEN"):
        lacks = "RAY_AUTH_TOKEN is not the cluster's token"
    elif not os.path.exists(path):
        lacks = f"RAY_AUTH_MODE=token, but there is no token at {path}"
    else:
        lacks = f"the token at {path} is not the cluster's"
    return (f"{lacks}; every node and driver needs the head node's token: copy its ~/.ray/auth_token to "
            "~/.ray/auth_token here (or point RAY_AUTH_TOKEN_PATH at it) and export RAY_AUTH_MODE=token, "
            "as README.md's \"Running on a cluster\" does")


def match_nodes(name: str, nodes: list[Node]) -> list[Node]:
    """The nodes NAME designates: a node id (or a prefix of 6+ characters), an IP, a host name, a
    custom resource, or a label KEY=VALUE."""
    name = str(name).strip()
    for test in (lambda n: n.node_id == name,
                 lambda n: len(name) >= 6 and n.node_id.startswith(name),
                 lambda n: n.ip == name,
                 lambda n: n.hostname == name,
                 lambda n: name in n.custom_resources,
                 lambda n: "=" in name and n.labels.get(name.partition("=")[0]) == name.partition("=")[2]):
        found = [n for n in nodes if test(n)]
        if found:
            return found
    return []


def unknown_node(option: str, name: str, nodes: list[Node]) -> InvalidCombinationError:
    """The error for a NODE name (of `option`, e.g. "--place learner=x") that matches no alive node."""
    words = {w for n in nodes for w in (n.ip, n.node_id, n.hostname, *n.custom_resources) if w}
    close = difflib.get_close_matches(str(name), sorted(words), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    listing = "; ".join(f"{n.ip} id {n.node_id[:12]} resources {','.join(n.custom_resources) or '-'}" for n in nodes)
    return InvalidCombinationError(f"{option}: no alive node has that IP, id, host name, resource or "
                                   f"label; {hint}nodes: {listing}")
