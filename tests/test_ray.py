"""`--launcher ray` on a Ray cluster of three nodes on this machine (one cluster for the module):
roles placed on different nodes, placements refused before anything starts, the per-run secret
(a client without it is refused and counted; the secret is in no log or result), the `ray`
transport, `rlbench ray nodes`, and Ray never imported where it is not used."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ray_support import local_cluster, node_of_resource, ray_unavailable
from support import REPO, killed_mid_way
from rlbench.config import RunConfig
from rlbench.errors import InvalidCombinationError
from rlbench.runtime import patience
from rlbench.runner import run

pytestmark = pytest.mark.skipif(ray_unavailable() is not None, reason=str(ray_unavailable()))

SHORT = {"learning_starts": 200, "batch_size": 32, "publish_every": 5}
MARKER = b"rlbench-test-secret-MARKER-0123"  # the run's secret in the secret test: 31 bytes + 1
ROGUE = r"""
import json, sys, numpy as np
from rlbench.plugins import get_registry
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.channel import Channel, RemoteError
from rlbench.runtime.distributed.messages import Op

transport = get_registry().get("transport", "tcp").create()
said = {}
channel = Channel(transport.connect(sys.argv[1]))
op, arrays = channel.request(Op.HELLO, {"role": messages.text("actor"), "index": np.int64(0),
                                        "nonce": np.frombuffer(b"n" * messages.NONCE_BYTES, np.uint8)})
said["hello"] = op.name
for step, request in (("auth", (Op.AUTH, {"proof": np.zeros(messages.PROOF_BYTES, np.uint8)})),
                      ("insert_after", (Op.STATUS, None))):
    try:
        said[step] = channel.request(*request)[0].name
    except RemoteError as exc:
        said[step] = str(exc)
    except ConnectionError as exc:  # the node closes a connection that failed to authenticate
        said[step] = f"closed: {exc}"
channel.close()
silent = Channel(transport.connect(sys.argv[1]))
try:
    said["no_hello"] = silent.request(Op.STATUS)[0].name
except RemoteError as exc:
    said["no_hello"] = str(exc)
silent.close()
print(json.dumps(said))
"""


@pytest.fixture(scope="module")
def cluster():
    with local_cluster() as started:
        yield started


@pytest.fixture(autouse=True)
def nothing_left_running(cluster):
    """After each test, no role's actor is left on any node and every CPU is free again."""
    import ray

    yield
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        named = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("rlbench-")]
        free = ray.available_resources().get("CPU", 0) == ray.cluster_resources().get("CPU")
        if not named and free:
            return
        time.sleep(0.2)
    raise AssertionError(f"left running on the cluster: {named}, CPUs free {ray.available_resources().get('CPU')}")


def ray_config(cluster, **kw) -> RunConfig:
    fields = dict(launcher="ray", ray_address=cluster.address, placement="server", transport="tcp", actors=2,
                  steps=800, eval_episodes=1, hyperparameters=dict(SHORT))
    fields.update(kw)
    return RunConfig(**fields)


@pytest.mark.parametrize("placement", ["server", "in-network"])
def test_a_dqn_run_puts_replay_learner_and_actors_on_three_nodes(cluster, placement):
    import ray

    from rlbench.results import render

    explicit = placement == "server"  # the other run is placed by default: spread over the nodes
    place = {"replay": "rlb_a", "learner": "rlb_b", "actors": ["rlb_c"]} if explicit else {}
    result = run(ray_config(cluster, placement=placement, place=place))
    assert result["status"] == "complete", result["status_reason"]
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["dropped"] == 0 and accounting["produced"] >= 800
    roles = result["loop"]["roles"]
    nodes = {name: roles[name]["node"] for name in ("replay", "learner", "actor-0", "actor-1")}
    if explicit:
        assert nodes == {"replay": node_of_resource("rlb_a"), "learner": node_of_resource("rlb_b"),
                         "actor-0": node_of_resource("rlb_c"), "actor-1": node_of_resource("rlb_c")}
    assert len({nodes["replay"], nodes["learner"], nodes["actor-0"]}) == 3, nodes
    for name in nodes:
        assert roles[name]["link"]["bytes_sent"] > 0 and roles[name]["link"]["messages_sent"] > 0, name
        assert roles[name]["host"]  # the node's IP
    launcher = result["loop"]["launcher"]
    assert launcher["name"] == "ray" and launcher["ray_version"] == ray.__version__
    assert set(launcher["nodes"]) == set(nodes.values())
    for node in launcher["nodes"].values():  # each node's own fingerprint: CPU, plugins
        assert node["fingerprint"]["cpu"] and "plugins" in node["fingerprint"]
    assert 0 < launcher["startup_s"] < patience(120)  # measured, in seconds (a loaded machine's start is slower)
    shown = render(result)
    assert f"ray {ray.__version__}" in shown
    for node_id in nodes.values():
        assert node_id[:12] in shown


def test_replay_shards_run_on_the_nodes_place_names_and_store_their_actors_transitions(cluster):
    """Issue #24 item 4: two replay nodes on two Ray nodes, actors hashed to them, the learner on a
    third drawing its batches across both."""
    place = {"replay": ["rlb_a", "rlb_b"], "learner": "rlb_c"}
    result = run(ray_config(cluster, replay_shards=2, actors=2, steps=1200, place=place))
    assert result["status"] == "complete", result["status_reason"]
    assert result["accounting"]["balanced"] and result["accounting"]["produced"] >= 1200
    roles = result["loop"]["roles"]
    assert [roles[name]["node"] for name in ("replay", "replay-1", "learner")] == \
        [node_of_resource("rlb_a"), node_of_resource("rlb_b"), node_of_resource("rlb_c")]
    shards = result["loop"]["replay_shards"]
    assert set(shards["replay"]["stored_by"]) == {"actor-0"} and set(shards["replay-1"]["stored_by"]) == {"actor-1"}
    assert all(shard["rate_limiter"]["samples"] > 0 for shard in shards.values())


def test_a_run_killed_on_this_host_resumes_on_the_ray_nodes_where_place_puts_it(cluster, tmp_path):
    """Issue #24 item 3: a checkpointing run of the local launcher, SIGKILLed mid-way, continues on
    three Ray nodes (other hosts: the checkpoint directory is one every node sees)."""
    from rlbench.runtime.checkpoint import resumed_config

    directory = tmp_path / "ckpt"
    record = killed_mid_way(directory, "--placement", "server", "--transport", "tcp", "--steps", "3000",
                            "--hp", "learning_starts=200", "--hp", "batch_size=32", "--checkpoint-every", "0.3",
                            at_env_steps=1000)
    place = {"replay": "rlb_a", "learner": "rlb_b", "actors": ["rlb_c"]}
    result = run(resumed_config(directory, launcher="ray", ray_address=cluster.address, place=place, out=None,
                                eval_episodes=1))
    assert result["status"] == "complete", result["status_reason"]
    assert result["resumed_from"]["env_steps"] == record["env_steps"] >= 1000
    assert result["accounting"]["balanced"] and result["accounting"]["produced"] >= 3000
    roles = result["loop"]["roles"]
    assert [roles[name]["node"] for name in ("replay", "learner", "actor-0")] == \
        [node_of_resource(place["replay"]), node_of_resource(place["learner"]), node_of_resource("rlb_c")]
    assert result["loop"]["launcher"]["name"] == "ray"


@pytest.mark.parametrize("place", [["rlb_a", "rlb_b"], ["rlb_b"]], ids=["one-per-node", "packed"])
def test_data_parallel_learners_run_where_place_puts_them_and_meet_through_ray(cluster, place):
    """Issue #23: two learners on two nodes (or packed on one), their rendezvous announced through
    Ray by learner 0, gradients averaged over gloo across the nodes, parameters identical."""
    result = run(ray_config(cluster, policy="data-parallel", learners=2, actors=1, place={"learner": place},
                            hyperparameters={**SHORT, "batch_size": 32}))
    assert result["status"] == "complete", result["status_reason"]
    assert result["accounting"]["balanced"]
    roles = result["loop"]["roles"]
    expected = [node_of_resource(place[0]), node_of_resource(place[-1])]
    assert [roles["learner"]["node"], roles["learner-1"]["node"]] == expected
    group = result["loop"]["learner_group"]
    assert group["learners"] == 2 and group["parameters_identical"] is True
    assert group["last_checked_update"] == result["throughput"]["updates"]  # compared after the last update
    assert roles["learner"]["updates"] == roles["learner-1"]["updates"] > 10


def test_a_node_listed_alive_whose_raylet_is_gone_is_not_a_place_to_put_roles(cluster):
    """A node restarted on a host: Ray lists its old id alive until its health checks notice, and
    `--place IP` resolved to that id was refused (issue #41 item 8). alive_nodes asks each raylet
    that shares an address with another node."""
    import socket

    import ray

    from rlbench.cluster.ray import alive_nodes

    listed = [n for n in ray.nodes() if n["Alive"]]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    gone_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now, as after a raylet died
    stale = dict(listed[0], NodeID="f" * 56, NodeManagerPort=gone_port)

    class Listing:  # the cluster's own listing, with the restarted node's old entry
        @staticmethod
        def nodes():
            return [stale, *listed]

    found = {node.node_id for node in alive_nodes(Listing)}
    assert found == {n["NodeID"] for n in listed}


def test_impossible_placements_are_refused_before_anything_starts(cluster):
    import ray

    from rlbench.plugins import get_registry
    from rlbench.cluster.ray import alive_nodes
    from rlbench.runtime.launchers.ray import plan_placement
    from rlbench.validate import validate

    with pytest.raises(InvalidCombinationError, match=r"has 2 CPUs, but the roles placed there need 3 \(actor-0, "
                                                      r"actor-1, actor-2"):
        run(ray_config(cluster, actors=3, place={"actors": ["rlb_c"]}))
    with pytest.raises(InvalidCombinationError, match=r"--place replay=rlb_bb: no alive node .* did you mean 'rlb_b'"):
        run(ray_config(cluster, place={"replay": "rlb_bb"}))
    # A learner on CUDA needs a GPU node; none of these has one (the gpu plugin's real capabilities).
    registry = get_registry()
    plan = validate(RunConfig(placement="server", transport="tcp"), registry)
    plan.compute = registry.get("compute", "gpu")
    with pytest.raises(InvalidCombinationError, match=r"learner needs a node with a GPU .* has none"):
        plan_placement(ray_config(cluster), plan, alive_nodes(ray))


# ------------------------------------------------------------- placement groups (--placement-strategy)
@pytest.mark.parametrize("strategy", ["spread", "pack"])
def test_a_placement_strategy_reserves_the_roles_as_bundles_of_one_group_removed_after_the_run(cluster, strategy):
    """Issue #24 item 4: every role a bundle of one placement group; --place pins the replay node's and
    the learner's bundles to rlb_a (its two CPUs), the actors' are Ray's to place: spread puts them on
    two nodes, pack on one (both fit there). The group is removed when the run ends."""
    import ray

    from rlbench.results import render

    result = run(ray_config(cluster, steps=600, placement_strategy=strategy, place={"replay": "rlb_a", "learner": "rlb_a"}))
    assert result["status"] == "complete", result["status_reason"]
    assert result["accounting"]["balanced"] and result["accounting"]["produced"] >= 600
    roles = result["loop"]["roles"]
    pinned = node_of_resource("rlb_a")
    assert roles["replay"]["node"] == roles["learner"]["node"] == pinned
    actors = {roles["actor-0"]["node"], roles["actor-1"]["node"]}
    assert pinned not in actors and len(actors) == (2 if strategy == "spread" else 1), actors
    group = result["loop"]["launcher"]["placement_group"]
    assert (group["strategy"], group["ray_strategy"], group["removed"]) == (strategy, strategy.upper(), True)
    assert [b["roles"] for b in group["bundles"]] == [["replay"], ["learner"], ["actor-0"], ["actor-1"]]
    for bundle in group["bundles"]:  # where each bundle landed is where its role's process said it ran
        assert bundle["resources"] == {"CPU": 1.0}
        assert roles[bundle["roles"][0]]["node"] == bundle["node"] and roles[bundle["roles"][0]]["bundle"] == bundle["index"]
    assert [b.get("label_selector") for b in group["bundles"]] == [{"ray.io/node-id": pinned}] * 2 + [None] * 2
    assert ray.util.placement_group_table()[group["id"]]["state"] == "REMOVED"
    assert f"placement group {strategy} ({strategy.upper()}): 4 bundles on {3 if strategy == 'spread' else 2} node(s)" \
        in render(result)


def test_an_actor_replaced_in_a_placement_group_goes_into_the_dead_actors_bundle(cluster):
    import ray

    killed: list[str] = []

    def kill_actor_0() -> None:
        _replay_address(ray, deadline=time.monotonic() + 90)  # the run is under way
        for actor in ray.util.list_named_actors(all_namespaces=True):
            if actor["name"].startswith("rlbench-") and actor["name"].endswith("-actor-0"):
                ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
                killed.append(actor["name"])

    killer = threading.Thread(target=kill_actor_0)
    killer.start()
    try:
        result = run(ray_config(cluster, steps=3000, actor_restarts=1, placement_strategy="spread"))
    finally:
        killer.join(120)
    assert killed, "actor-0 was never seen running"
    assert result["status"] == "complete", result["status_reason"]
    assert [(i["slot"], i["died"], i["replaced_by"]) for i in result["loop"]["actor_incarnations"]] == \
        [("actor-0", "actor-0", "actor-2")]
    roles = result["loop"]["roles"]
    bundle = result["loop"]["launcher"]["placement_group"]["bundles"][2]
    assert bundle["roles"] == ["actor-0", "actor-2"]
    assert roles["actor-2"]["bundle"] == roles["actor-0"]["bundle"] == 2
    assert roles["actor-2"]["node"] == roles["actor-0"]["node"] == bundle["node"]
    assert roles["actor-2"]["produced"] > 0 and result["accounting"]["balanced"]


def test_a_run_stopped_by_a_second_ctrl_c_still_removes_its_placement_group(cluster, monkeypatch):
    import os
    import signal

    import ray

    from rlbench.runtime.launchers.ray import RayLauncher

    stop_all = RayLauncher.stop_all  # the replay node, never told to shut down, gets 1 s, not GRACE_S
    monkeypatch.setattr(RayLauncher, "stop_all", lambda self, grace=1.0: stop_all(self, grace))
    before = set(ray.util.placement_group_table())

    def interrupt_twice() -> None:
        _replay_address(ray, deadline=time.monotonic() + 90)
        for _ in range(2):  # the first stops the run in order, the second at once
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_twice)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):  # runner.SignalInterrupt, or Ray's own when it lands in a Ray call
            run(ray_config(cluster, steps=200_000, actors=1, placement_strategy="pack"))
    finally:
        interrupter.join(120)
    ours = [g for pid, g in ray.util.placement_group_table().items() if pid not in before]
    assert [(g["name"].startswith("rlbench-"), g["state"]) for g in ours] == [(True, "REMOVED")]


def test_a_placement_group_that_cannot_be_placed_is_refused_before_anything_starts(cluster, monkeypatch):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from rlbench.errors import RlbenchError
    from rlbench.runtime.launchers import ray as ray_launcher

    def started() -> list[str]:
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("rlbench-")]

    before = set(ray.util.placement_group_table())
    with pytest.raises(InvalidCombinationError, match=r"\(PACK: 7 bundles, 1 CPU each for replay, learner, "
                                                      r"actor-0..actor-4\) needs 7 CPUs, but the cluster's 3 alive "
                                                      r"node\(s\) have 6: run fewer --actors"):
        run(ray_config(cluster, actors=5, placement_strategy="pack"))
    with pytest.raises(InvalidCombinationError, match=r"needs 4 nodes, one per bundle, and the cluster has 3"):
        run(ray_config(cluster, placement_strategy="strict-spread"))
    with pytest.raises(InvalidCombinationError, match=r"needs one node with 4 CPUs, and the largest, node .* has 2: "
                                                      r"use --placement-strategy pack"):
        run(ray_config(cluster, placement_strategy="strict-pack"))
    assert set(ray.util.placement_group_table()) == before  # refused from the cluster's totals: no group made
    # It fits the cluster, but another job holds 4 of its 6 CPUs: not placed in time, removed, refused.
    monkeypatch.setattr(ray_launcher, "GROUP_TIMEOUT_S", 2.0)
    other = placement_group([{"CPU": 2}, {"CPU": 2}], strategy="STRICT_SPREAD")
    assert other.wait(30)
    try:
        with pytest.raises(RlbenchError, match=r"\(SPREAD: 4 bundles, 4 CPUs\) was not placed within 2 s: 2 CPUs "
                                               r"free in the cluster \(node .*: 0 of 2 free.*\), other jobs hold the "
                                               r"rest; nothing of the run was started"):
            run(ray_config(cluster, placement_strategy="spread"))
        assert not started()
        ours = [g for pid, g in ray.util.placement_group_table().items() if pid not in before and g["name"].startswith("rlbench-")]
        assert len(ours) == 1 and ours[0]["state"] == "REMOVED"
    finally:
        remove_placement_group(other)


def test_a_transport_that_stays_on_one_host_is_refused_across_hosts():
    from rlbench.plugins import get_registry
    from rlbench.runtime.launchers import listen_address
    from rlbench.validate import check_hosts, validate

    registry = get_registry()
    plan = validate(RunConfig(placement="server", transport="shm"), registry)
    check_hosts(plan, registry, ["10.0.0.1", "10.0.0.1"])  # one host: shm is fine
    with pytest.raises(InvalidCombinationError, match=r"transport shm stays on one host, but this run places roles "
                                                      r"on 2 hosts \(10.0.0.1, 10.0.0.2\); transports that cross hosts: "
                                                      r"tcp, udp, ray"):
        check_hosts(plan, registry, ["10.0.0.1", "10.0.0.2"])
    assert listen_address(registry.get("transport", "tcp").create(), "tcp", "10.0.0.1") == "tcp://10.0.0.1:0"
    dpdk = registry.get("transport", "dpdk") if "dpdk" in registry.names("transport") else None
    if dpdk is not None and dpdk.probe().available:  # memif is a port between processes of one host
        from rlbench.kit.framing import AddressError

        with pytest.raises(AddressError, match="memif"):
            listen_address(dpdk.create(port="memif"), "dpdk", "10.0.0.1")


def test_a_client_without_the_secret_is_refused_and_counted_and_the_secret_is_never_written(cluster, monkeypatch):
    import ray

    from rlbench.runtime.distributed import driver

    monkeypatch.setattr(driver.secrets, "token_bytes", lambda n: (MARKER + b"!")[:n])
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(result=run(ray_config(cluster, steps=4000, actors=1))))
    runner.start()
    try:
        address = _replay_address(ray, deadline=time.monotonic() + 90)
        rogue = subprocess.run([sys.executable, "-c", ROGUE, address], capture_output=True, text=True, timeout=60,
                               cwd=REPO)
        assert rogue.returncode == 0, rogue.stderr
        said = json.loads(rogue.stdout.strip().splitlines()[-1])
    finally:
        runner.join(240)
    assert said["hello"] == "CHALLENGE"
    assert "authentication failed" in said["auth"]
    assert said["insert_after"].startswith("closed") and "before authentication" in said["no_hello"]
    result = outcome["result"]
    assert result["status"] == "complete", result["status_reason"]
    assert result["counters"]["replay.auth_failed"] >= 1 and result["counters"]["replay.unauthenticated"] >= 1
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["dropped"] == 0 and accounting["stored"] == accounting["produced"]
    # The secret went to the roles through Ray: it is in no result and in none of Ray's logs.
    written = json.dumps(result, default=str).encode()
    session = Path(ray._private.worker.global_worker.node.get_session_dir_path())
    for form in (MARKER, MARKER.hex().encode()):
        assert form not in written
        for log in (session / "logs").rglob("*"):
            if log.is_file():
                assert form not in log.read_bytes(), f"the run's secret is in {log}"


def _replay_address(ray, deadline: float) -> str:
    """The replay node's address, from its role actor (named rlbench-<run>-replay)."""
    while time.monotonic() < deadline:
        for actor in ray.util.list_named_actors(all_namespaces=True):
            if actor["name"].startswith("rlbench-") and actor["name"].endswith("-replay"):
                handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
                address = ray.get(handle.announced.remote(30))
                if address:
                    return address
        time.sleep(0.1)
    raise AssertionError("the replay node never listened")


def test_the_ray_transport_passes_the_conformance_kit(cluster):
    from rlbench.builtin.transports.ray_actors import RayTransport
    from rlbench.testing import check_transport

    check_transport(RayTransport, timeout=30, sizes=(0, 1, 64, 4095, 65537, 1 << 20))


def test_a_run_over_the_ray_transport_carries_every_transition(cluster):
    # Roles on different nodes talk through Ray actor calls; the replay node's last replies (its
    # report, SHUTDOWN's OK) still reach the launcher as its inbox closes.
    result = run(ray_config(cluster, transport="ray", actors=1, steps=600,
                            place={"replay": "rlb_a", "learner": "rlb_b", "actors": ["rlb_c"]}))
    assert result["status"] == "complete", result["status_reason"]
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["dropped"] == 0 and accounting["produced"] >= 600
    assert result["latency"]["replay.SAMPLE"]["count"] > 0


def test_ray_nodes_lists_each_node_its_resources_and_components(cluster):
    from click.testing import CliRunner

    from rlbench.cluster.cli import ray_group

    done = CliRunner().invoke(ray_group, ["nodes", "--ray-address", cluster.address, "--json"])
    assert done.exit_code == 0, done.output
    nodes = json.loads(done.output)
    assert {n["node_id"] for n in nodes} == {node_of_resource(r) for r in ("rlb_a", "rlb_b", "rlb_c")}
    for node in nodes:
        assert node["resources"]["CPU"] == 2
        assert node["components"]["transport"]["tcp"]["available"]
        assert node["components"]["algorithm"]["dqn"]["available"]
    shown = CliRunner().invoke(ray_group, ["nodes", "--ray-address", cluster.address])
    assert shown.exit_code == 0 and "rlb_b" in shown.output and "tcp" in shown.output


def test_profile_measures_each_host_on_one_of_its_own_nodes(cluster, tmp_path):
    from click.testing import CliRunner

    from rlbench.plan.cli import profile_command
    from rlbench.plan.profile import load_profile, this_host_key

    out = tmp_path / "cluster.json"
    job = ["--job", "qlearning:Taxi-v3", "--dataset", "1000", "-o", str(out)]
    pinned = CliRunner().invoke(profile_command, ["--ray-address", cluster.address, "--nodes", "rlb_c", *job])
    assert pinned.exit_code == 0, pinned.output
    entry = load_profile(out)["hosts"][this_host_key()]
    assert entry["measured_on"]["node_id"] == node_of_resource("rlb_c")  # not the driver's node (rlb_a)
    assert any(s["compute"] == "cpu" and s["available"] for s in entry["jobs"]["qlearning Taxi-v3"]["settings"])
    # The three nodes are one machine: one host, measured once, listing every node it has.
    every = CliRunner().invoke(profile_command, ["--ray-address", cluster.address, *job])
    assert every.exit_code == 0, every.output
    document = load_profile(out)
    assert list(document["hosts"]) == [this_host_key()]
    assert {n["node_id"] for n in document["hosts"][this_host_key()]["ray_nodes"]} == \
        {node_of_resource(r) for r in ("rlb_a", "rlb_b", "rlb_c")}
    unknown = CliRunner().invoke(profile_command, ["--ray-address", cluster.address, "--nodes", "rlb_q", *job])
    assert unknown.exit_code != 0 and "did you mean 'rlb_" in str(unknown.exception)


def test_ray_is_not_imported_by_import_rlbench_list_or_a_local_run():
    script = ("import sys\n"
              "import rlbench\n"
              "from rlbench.cli import cli\n"
              "from click.testing import CliRunner\n"
              "assert CliRunner().invoke(cli, ['list']).exit_code == 0\n"
              "from rlbench.runner import run\n"
              "from rlbench.config import RunConfig\n"
              "r = run(RunConfig(placement='server', transport='tcp', steps=300, eval_episodes=1,\n"
              "                  hyperparameters={'learning_starts': 100, 'batch_size': 32}))\n"
              "assert r['status'] == 'complete' and r['loop']['launcher']['name'] == 'local'\n"
              "print('ray' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_the_set_up_installs_the_pinned_ray_and_the_probe_names_it():
    import ray

    from rlbench.builtin.capabilities import RAY_REQUIREMENT

    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert f'"{RAY_REQUIREMENT}"' in setup
    assert RAY_REQUIREMENT == f"ray=={ray.__version__}"
