"""Issue #39's distributed Atari target: runs of 4 actors at placement server and in-network, over shm,
tcp and dpdk (where its probe says it is available), udp once, with exact accounting (per actor and in
total), a replay node that stores each frame once, and the CNN's weights on the wire per learner update.
(An image run SIGKILLed mid-way and resumed, its memory of frames restored exactly: test_checkpoint.py.)
Tiny budgets: each run takes seconds (the learning evidence lives in studies)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from support import rlb_processes
from rlbench.config import RunConfig
from rlbench.kit.networks import image_network
from rlbench.plugins import get_registry
from rlbench.results import render
from rlbench.runner import run

ATARI = "ALE/Pong-v5"
PUBLISH_EVERY = 10
# past the actors' lead (learning_starts, the rate limiter's slack, an INSERT in flight each: about
# 1,650 env steps for 4 actors), so the learner must have updated whatever order the roles started in
STEPS = 2000
SHORT = {"learning_starts": 100, "buffer_size": 3000, "batch_size": 16, "publish_every": PUBLISH_EVERY}


@pytest.fixture(autouse=True)
def no_role_outlives_its_run():
    yield
    deadline = time.monotonic() + 10
    while rlb_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rlb_processes() == [], "role processes outlived the run"


def available(env: str) -> None:
    probe = get_registry().get("environment", env).probe()
    if not probe.available:  # the envs extra (ale-py, opencv, minatar) is not installed
        pytest.skip(probe.reason)


def image_run(env: str = ATARI, **kw) -> dict:
    available(env)
    config = RunConfig(env=env, actors=4, steps=STEPS, eval_episodes=0, hyperparameters=dict(SHORT), **kw)
    result = run(config)
    assert result["status"] == "complete", result["status_reason"]
    return result


def spec_of(env: str):
    built = get_registry().get("environment", env).create(num_envs=1, seed=0)
    built.close()
    return built.spec


def assert_exact_accounting(result: dict, actors: int) -> None:
    """Produced = stored + dropped for every actor (its own count against the node's) and in total."""
    accounting = result["accounting"]
    roles = result["loop"]["roles"]
    lost = {name: role["lost"] for name, role in roles.items() if role.get("lost")}  # why, if a role lost the node
    assert accounting["balanced"] and accounting["dropped"] == 0 and accounting["produced"] >= STEPS, (
        accounting, lost, result["loop"]["links"].get("replay"))
    stored_by = roles["replay"]["stored_by"]
    names = [f"actor-{i}" for i in range(actors)]
    for name in names:
        report = roles[name]
        assert report["produced"] == report["sent"] + sum(report["dropped"].values()) == stored_by[name], name
    assert sum(roles[name]["produced"] for name in names) == accounting["produced"] == accounting["stored"]


def assert_each_frame_stored_once(result: dict, spec) -> None:
    """The node's memory holds a stream's frames once: one new frame per transition, at most k more per
    episode begun, where storing stacks would hold 2k per transition."""
    memory = result["replay_stats"]
    frames = memory["frames"]
    k = frames["frames"]
    assert k == (spec.frame_stack or 1) and memory["fields"]["obs"] == f"uint8{list(spec.observation_shape)}"
    assert memory["size"] == result["accounting"]["stored"] <= memory["capacity"]  # nothing overwritten yet
    assert frames["references"] == 2 * k * memory["size"]
    episodes_begun = len(result["learning_curve"]) + result["config"]["actors"]
    assert frames["frames_held"] <= memory["size"] + k * episodes_begun
    assert frames["frame_bytes"] == frames["frames_held"] * int(np.prod(frames["frame_shape"]))


def assert_weights_per_update(result: dict, spec, actors: int) -> None:
    """The CNN's weights, counted per link: the learner's publications (its first weights, every
    PUBLISH_EVERY updates, its final ones) and each actor's fetches, in whole messages' bytes, and per
    learner update; never more than the links carried."""
    weights = result["loop"]["weights"]
    roles = result["loop"]["roles"]
    payload = image_network(spec.observation_shape, spec.observation_dtype, spec.n_actions).parameters() * 4
    assert 0 < weights["params_bytes"] - payload < 4096  # the float32 weights, and the message's header
    updates = roles["learner"]["updates"]
    assert weights["learner_updates"] == updates == result["throughput"]["updates"] > 0
    assert weights["published"] == 2 + updates // PUBLISH_EVERY
    links = weights["links"]
    published = weights["published"] * weights["params_bytes"]
    assert links["learner"] == {"direction": "published", "messages": weights["published"], "bytes": published,
                                "bytes_per_update": pytest.approx(published / updates)}
    assert roles["learner"]["link"]["bytes_sent"] > links["learner"]["bytes"]
    fetched = 0
    for name in (f"actor-{i}" for i in range(actors)):
        assert links[name]["direction"] == "fetched" and links[name]["messages"] >= 1  # its first weights at least
        assert links[name]["bytes"] == links[name]["messages"] * weights["params_bytes"]
        assert roles[name]["link"]["bytes_received"] > links[name]["bytes"]
        fetched += links[name]["messages"]
    assert weights["fetched"] == fetched
    per_update = weights["bytes_per_update"]
    assert per_update["total"] == pytest.approx((weights["published"] + fetched) * weights["params_bytes"] / updates)
    assert per_update["published"] + per_update["fetched"] == pytest.approx(per_update["total"])


def dpdk_options() -> dict:
    try:
        dpdk = get_registry().get("transport", "dpdk")
    except KeyError:
        pytest.skip("the dpdk plugin is not installed (pip install -e plugins/dpdk)")
    probe = dpdk.probe()
    if not probe.available:
        pytest.skip(probe.reason)
    return {"transport": {"port": "memif"}}


@pytest.mark.parametrize("placement, transport", [("server", "shm"), ("in-network", "tcp"), ("in-network", "dpdk")])
def test_a_distributed_atari_run_of_four_actors_is_exact_stores_frames_once_and_counts_weights(placement, transport):
    options = dpdk_options() if transport == "dpdk" else {}
    result = image_run(placement=placement, transport=transport, options=options)
    spec = spec_of(ATARI)
    assert_exact_accounting(result, actors=4)
    assert_each_frame_stored_once(result, spec)
    assert_weights_per_update(result, spec, actors=4)
    weights = result["loop"]["weights"]
    assert weights["params_bytes"] > 6.7e6  # the Nature CNN's, 1.7 M parameters
    shown = render(result)  # what `rlbench show` prints of them
    assert (f"weights: {weights['params_bytes'] / 1e6:,.2f} MB a message; {weights['published']} published to the "
            f"replay node, {weights['fetched']} fetched by actors, over {weights['learner_updates']} learner updates"
            in shown)
    assert f"each frame once: {result['replay_stats']['frames']['frames_held']:,} frames held" in shown
    if placement == "in-network":
        assert result["latency"]["replay_node.push.BATCH"]["count"] > 0


def test_a_minatar_run_over_udp_fragments_the_weights_and_loses_nothing():
    result = image_run("MinAtar/Breakout-v1", placement="server", transport="udp")
    spec = spec_of("MinAtar/Breakout-v1")
    assert_exact_accounting(result, actors=4)
    assert_each_frame_stored_once(result, spec)  # k = 1: obs and next_obs share their frames
    assert_weights_per_update(result, spec, actors=4)
    for name, link in result["loop"]["links"].items():
        assert link["lost"] == 0, name
