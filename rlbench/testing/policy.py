"""check_policy: does a distribution policy keep the contract launchers rely on?

- its capabilities are PolicyCapabilities, and a factory makes a fresh policy;
- `check(config, hp)` accepts a run its capabilities describe (one learner, or two where it runs
  several; a placement it declares) and refuses one it cannot carry with an RlbenchError whose one
  line says why (a placement it does not declare; several learners when it runs one);
- `learners(config)` is 1 for a policy of one learner and the configured number otherwise;
- `learner_group(...)` is None for one learner; for several, a group of one (rank 0, world 1) is
  made here, in this process: it announces a rendezvous, splits a batch into its share, attaches to
  a real learner (DQN on CartPole's shapes) whose update then still trains, reports JSON, leaves and
  closes without waiting on anyone.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rlbench.errors import RlbenchError


def _resolve(policy_or_factory: Any) -> tuple[Any, Any]:
    """(factory, policy): a registered name, a factory (class or callable) or a policy."""
    if isinstance(policy_or_factory, str):
        from rlbench.plugins import get_registry

        component = get_registry().get("policy", policy_or_factory)
        return component.create, component.create()
    if isinstance(policy_or_factory, type) or not hasattr(policy_or_factory, "learners"):
        return policy_or_factory, policy_or_factory()
    return None, policy_or_factory


def check_policy(policy_or_factory: Any) -> None:
    """Raise AssertionError naming the first defect; return quietly when the policy conforms."""
    from rlbench.algorithms.dqn import DQNConfig
    from rlbench.config import RunConfig
    from rlbench.protocols import PLACEMENTS, PolicyCapabilities

    factory, policy = _resolve(policy_or_factory)
    caps = getattr(policy, "capabilities", None)
    assert isinstance(caps, PolicyCapabilities), "policy.capabilities must be a rlbench.protocols.PolicyCapabilities"
    assert caps.learners in ("one", "many"), f"capabilities.learners must be 'one' or 'many', got {caps.learners!r}"
    assert caps.placements and set(caps.placements) <= set(PLACEMENTS), \
        f"capabilities.placements {caps.placements} must be some of {PLACEMENTS}"
    if factory is not None:
        assert factory() is not factory(), "the factory must make a new policy each time"

    hp = DQNConfig(batch_size=64)
    learners = 2 if caps.learners == "many" else 1
    accepted = RunConfig(placement=caps.placements[0], learners=learners)
    try:
        policy.check(accepted, hp)
    except RlbenchError as exc:
        raise AssertionError(f"check() refused a run its capabilities describe ({learners} learner(s), placement "
                             f"{caps.placements[0]}): {exc}") from None
    refused = [dataclasses.replace(accepted, placement=p) for p in PLACEMENTS if p not in caps.placements]
    if caps.learners == "one":
        refused.append(dataclasses.replace(accepted, learners=3))
    for config in refused:
        try:
            policy.check(config, hp)
        except RlbenchError as exc:
            assert str(exc) and "\n" not in str(exc), f"check()'s refusal must be one line, got {str(exc)!r}"
            continue
        except Exception as exc:
            raise AssertionError(f"check() must refuse with an RlbenchError, raised {type(exc).__name__}: {exc}") from None
        raise AssertionError(f"check() accepted placement {config.placement} with {config.learners} learner(s), which "
                             f"its capabilities ({caps}) do not describe")
    assert policy.learners(accepted) == learners, \
        f"learners() says {policy.learners(accepted)} for a run of {learners} learner(s)"

    announced: list[str] = []
    group = policy.learner_group(0, 1, "", "127.0.0.1", announced.append)
    if caps.learners == "one":
        assert group is None, "a policy of one learner makes no learner group"
        return
    assert group is not None, "a policy of several learners makes a learner group"
    try:
        _check_group(group, announced, hp)
    finally:
        group.close()


def _check_group(group: Any, announced: list[str], hp: Any) -> None:
    import numpy as np

    from rlbench.algorithms.dqn import DQNLearner
    from rlbench.builtin.compute_cpu import CpuCompute
    from rlbench.protocols import EnvSpec, Sample

    assert len(announced) == 1 and announced[0], "learner 0 announces its group's rendezvous (once)"
    assert (group.rank, group.world) == (0, 1), "the group keeps its rank and world"
    assert group.share(hp.batch_size) == hp.batch_size, "a group of one takes the whole batch"
    spec = EnvSpec(id="check", num_envs=1, observation_shape=(4,), observation_dtype="float32",
                   action_kind="discrete", n_actions=2)
    learner = DQNLearner(spec, CpuCompute(), hp, seed=0)
    before = [p.detach().clone() for p in learner.q_network.parameters()]
    group.attach(learner)
    rng = np.random.default_rng(0)
    n = hp.batch_size
    sample = Sample(np.arange(n), {"obs": rng.standard_normal((n, 4), dtype=np.float32),
                                   "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
                                   "next_obs": rng.standard_normal((n, 4), dtype=np.float32),
                                   "done": np.zeros(n, np.float32)}, np.ones(n, np.float32))
    group.begin_step(alive=True)
    learner.update(sample)
    moved = any(not bool((p.detach() == b).all()) for p, b in zip(learner.q_network.parameters(), before))
    assert moved, "after attach, the learner's update no longer trains it"
    group.begin_step(alive=False)
    group.leave()  # ends alone: must not wait on anyone
    report = group.report()
    assert isinstance(report, dict), "report() returns a dict"
    json.dumps(report)
