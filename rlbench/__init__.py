"""rlbench: a plugin-based benchmark harness for distributed reinforcement learning.

Importing this package is cheap on purpose: it does not import torch, pyopencl or DPDK.
Components are reached through the registry, which loads their factories lazily.
"""

from rlbench.config import RunConfig
from rlbench.errors import RlbenchError, UnknownComponentError, InvalidCombinationError
from rlbench.version import __version__

__all__ = ["__version__", "RlbenchError", "UnknownComponentError", "InvalidCombinationError", "RunConfig",
           "get_registry", "run"]


def get_registry(*, refresh: bool = False):
    """The registry of every component from every enabled plugin (built-ins included)."""
    from rlbench.plugins import get_registry as _get

    return _get(refresh=refresh)


def run(config: RunConfig, **kwargs):
    """Run one configuration end to end and return its result document (see `rlbench.runner.run`)."""
    from rlbench.runner import run as _run

    return _run(config, **kwargs)
