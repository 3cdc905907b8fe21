"""Conformance checks for component authors, like gymnasium's `check_env`.

Call them from your plugin's own tests; each raises `AssertionError` with what is wrong::

    from rlbench.testing import check_transport, check_replay_memory, check_compute_backend, check_environment
    check_replay_memory(lambda capacity: MyReplay(capacity=capacity, alpha=0.6, seed=0))
    check_environment(lambda num_envs, seed, **options: MyEnv(num_envs, seed=seed, **options))

`registered(name=plugin)` puts a plugin in this process's registry for a test, without installing it.
"""

from rlbench.testing.compute import check_compute_backend
from rlbench.testing.environment import check_environment
from rlbench.testing.plugins import registered
from rlbench.testing.policy import check_policy
from rlbench.testing.replay import check_replay_memory
from rlbench.testing.transport import check_transport, still_serves

__all__ = ["check_transport", "check_replay_memory", "check_compute_backend", "check_environment", "check_policy",
           "still_serves", "registered"]
