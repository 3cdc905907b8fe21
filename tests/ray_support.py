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


@contextlib.contextmanager
def local_cluster() -> Iterator[object]:
    """Three Ray nodes on this machine (resources rlb_a on the head, rlb_b, rlb_c); this process is
    connected to it as the driver."""
    os.environ.update(RAY_ENV)
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


def node_of_resource(resource: str) -> str:
    import ray

    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"])
