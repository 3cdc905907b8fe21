"""An Atari run's messages over memif at MTU 1500 and 9000 (issue #39, item 4): a real replay node (its
own process, storing each frame once) takes an actor's framed INSERT of 128 stacked 4x84x84 transitions,
answers the learner's SAMPLE of 32 with the exact stacks (~1.8 MB), and relays the Nature CNN's 6.7 MB
of weights from the learner to the actor, intact."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlbench.kit.access import replay_node
from rlbench.kit.bench import image_transitions
from rlbench.kit.networks import nature_cnn

FIELDS = ("obs", "action", "reward", "next_obs", "done")


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_an_atari_runs_messages_cross_memif(dpdk_available, mtu):
    rows = image_transitions(128, seed=mtu)
    rng = np.random.default_rng(mtu)
    weights = [rng.standard_normal(shape, dtype=np.float32) for shape in nature_cnn((4, 84, 84), 4).weight_shapes()]
    with replay_node("dpdk", transport_options={"port": "memif", "mtu": mtu}, replay="prioritized", capacity=256,
                     frames=4, timeout=60) as node:
        node.actor.add(rows)
        sample = node.learner.sample(32, 0.4)
        for name in FIELDS:
            np.testing.assert_array_equal(sample.transitions[name], rows[name][sample.indices])
        assert sample.transitions["obs"].dtype == np.uint8
        node.learner.publish_params(weights, 3)  # one way: the actor asks until the node has them
        deadline = time.monotonic() + 30
        while (fetched := node.actor.fetch_params(-1)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fetched is not None and fetched[0] == 3
        assert all(np.array_equal(got, sent) for got, sent in zip(fetched[1], weights))
        report = node.report()
        assert report["stored"] == 128 and report["link"]["lost"] == 0
        assert report["memory"]["frames"]["frames_held"] <= 2 * 128  # the INSERT's frames, each once
