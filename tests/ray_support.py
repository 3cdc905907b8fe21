"""Ray clusters for the tests, always taken down: `local_cluster`, three Ray nodes as processes of
this machine (ray.cluster_utils.Cluster) told apart by a custom resource each (rlb_a, rlb_b, rlb_c).
The cluster of real hosts (network namespaces) is rlbench.cluster.netns."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from rlbench.builtin.transports.ray_actors import SMALL_OBJECT_STORE_BYTES
from rlbench.cluster.netns import FAST_HEALTH_CHECKS, NODE_CPUS, RAY_ENV


def ray_unavailable() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (scripts/setup.sh installs it)"
    return None


# Three Ray nodes with their agents, and a run's four roles, on one machine's cores: with two CPU-bound
# processes beside the tests, a role's actor took over the runtime's 60 s to start on its node, and a
# learner's first SAMPLE waited over its 60 s for the actors' first transitions (the run "incomplete":
# "no reply to SAMPLE from the replay node within 60 s"). The roles were healthy, only slow, and those
# timeouts detect a lost peer, they pace nothing: the cluster's runs get 4x the patience
# (rlbench.runtime.patience; a role truly lost is still found, within 4 minutes); each run is still
# bounded by its steps, not by a time.
LOADED_MACHINE_PATIENCE = "4"


@contextlib.contextmanager
def local_cluster() -> Iterator[object]:
    """Three Ray nodes on this machine (resources rlb_a on the head, rlb_b, rlb_c); this process is
    connected to it as the driver. Their roles, and this process's launcher, wait LOADED_MACHINE_PATIENCE
    times the runtime's timeouts (the nodes' processes inherit the variable from this one)."""
    from rlbench.runtime import TIMEOUT_FACTOR_ENV

    os.environ.update(RAY_ENV)
    before = os.environ.get(TIMEOUT_FACTOR_ENV)
    os.environ[TIMEOUT_FACTOR_ENV] = LOADED_MACHINE_PATIENCE
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=NODE_CPUS, resources={"rlb_a": 1}, object_store_memory=SMALL_OBJECT_STORE_BYTES, include_dashboard=False,
        _system_config=FAST_HEALTH_CHECKS))
    try:
        for name in ("rlb_b", "rlb_c"):
            cluster.add_node(num_cpus=NODE_CPUS, resources={name: 1}, object_store_memory=SMALL_OBJECT_STORE_BYTES)
        ray.init(address=cluster.address, log_to_driver=False, namespace="rlbench-tests")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if before is None:
            os.environ.pop(TIMEOUT_FACTOR_ENV, None)
        else:
            os.environ[TIMEOUT_FACTOR_ENV] = before


def node_of_resource(resource: str) -> str:
    import ray

    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"])
