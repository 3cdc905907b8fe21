"""`--launcher ray` across real hosts: three network namespaces on a bridge, each a Ray node started
with `ray start` inside it, so every role has its own IP and what roles exchange crosses virtual
links. Transitions over tcp and over the dpdk plugin's af_packet ports, a one-host transport
refused, Ctrl-C, and nodes lost mid-run (their raylet killed). Needs root and `ip`; one cluster
for the module (the tests that kill nodes come last)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from rlbench.cluster.netns import VENV_BIN, namespace_cluster, namespaces_unavailable

pytestmark = pytest.mark.skipif(namespaces_unavailable() is not None, reason=str(namespaces_unavailable()))

SHORT = ("--eval-episodes", "1", "--hp", "learning_starts=200", "--hp", "batch_size=32", "--actors", "2",
         "--placement", "server")


@pytest.fixture(scope="module")
def cluster():
    with namespace_cluster() as started:
        yield started


@pytest.fixture(autouse=True)
def nothing_left_running(cluster):
    yield
    deadline = time.monotonic() + 20
    while cluster.role_threads() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster.role_threads() == [], "role processes outlived the run on a node"


def spread(cluster, replay=1, learner=0, actors=(1, 2)) -> list[str]:
    """--place flags: by default the replay node on b with actor-0, the learner on a (with the
    launcher), actor-1 alone on c."""
    ips = cluster.ips
    return ["--place", f"replay={ips[replay]}", "--place", f"learner={ips[learner]}",
            "--place", "actors=" + ",".join(ips[i] for i in actors)]


def run_args(cluster, out, *args) -> list[str]:
    return ["run", "--launcher", "ray", "--ray-address", cluster.address, *SHORT, "--out", str(out), *args]


def dpdk_unavailable() -> str | None:
    from rlbench.plugins import get_registry

    registry = get_registry()
    if "dpdk" not in registry.names("transport"):
        return "the dpdk plugin is not installed"
    probe = registry.get("transport", "dpdk").probe()
    return None if probe.available else probe.reason


def wait_for_roles(cluster, wanted: set[tuple[int, str]], proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until every (namespace index, role thread name) in `wanted` runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = {(cluster.names.index(ns), thread) for ns, _, thread in cluster.role_threads()}
        if wanted <= running:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError(f"roles {wanted} never all ran (running: {cluster.role_threads()})")


@pytest.mark.parametrize("transport", ["tcp", "dpdk"])
def test_transitions_cross_the_virtual_links(cluster, tmp_path, transport):
    extra = []
    if transport == "dpdk":
        reason = dpdk_unavailable()
        if reason:
            pytest.skip(reason)
        extra = ["--dpdk-port", "af_packet:eth0"]  # every namespace's own eth0: a port on each host
    out = tmp_path / "result.json"
    sent_before = [cluster.tx_bytes(i) for i in range(3)]
    done = cluster.rlbench(0, *run_args(cluster, out, "--transport", transport, "--steps", "1000", *spread(cluster),
                                        *extra))
    sent = [cluster.tx_bytes(i) - before for i, before in enumerate(sent_before)]
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "complete", result["status_reason"]
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["dropped"] == 0 and accounting["produced"] >= 1000
    roles = result["loop"]["roles"]
    ips = cluster.ips
    assert {name: roles[name]["host"] for name in ("replay", "learner", "actor-0", "actor-1")} == {
        "replay": ips[1], "learner": ips[0], "actor-0": ips[1], "actor-1": ips[2]}
    # What actor-1 sent the replay node left c over its link, and what the learner sent left a over its.
    assert 0 < roles["actor-1"]["link"]["bytes_sent"] <= sent[2]
    assert 0 < roles["learner"]["link"]["bytes_sent"] <= sent[0]
    launcher = result["loop"]["launcher"]
    assert launcher["hosts"] == sorted(ips) and launcher["ray_version"]
    shown = subprocess.run([str(VENV_BIN / "rlbench"), "show", str(out)], capture_output=True, text=True, timeout=60,
                           check=True).stdout
    assert all(ip in shown for ip in ips) and f"ray {launcher['ray_version']}" in shown


def test_data_parallel_learners_on_two_hosts_form_their_group_across_the_links(cluster, tmp_path):
    # gloo binds to what the host name resolves to (127.0.0.1 here, as on many hosts) unless told the
    # interface: learner-1 on c then dialled its own loopback and the group never formed (run incomplete)
    out = tmp_path / "result.json"
    ips = cluster.ips
    done = cluster.rlbench(0, *run_args(cluster, out, "--transport", "tcp", "--steps", "600", "--policy", "data-parallel",
                                        "--learners", "2", "--place", f"replay={ips[0]}",
                                        "--place", f"learner={ips[1]},{ips[2]}", "--place", f"actors={ips[0]},{ips[2]}"))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "complete", result["status_reason"]
    roles = result["loop"]["roles"]
    assert (roles["learner"]["host"], roles["learner-1"]["host"]) == (ips[1], ips[2])
    group = result["loop"]["learner_group"]
    assert group["learners"] == 2 and group["parameters_identical"] is True
    assert group["last_checked_update"] == result["throughput"]["updates"] > 0  # compared after the last update


def test_a_transport_that_stays_on_one_host_is_refused_before_anything_starts(cluster, tmp_path):
    out = tmp_path / "result.json"
    done = cluster.rlbench(0, *run_args(cluster, out, "--transport", "shm", "--steps", "500", *spread(cluster)))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "transport shm stays on one host" in done.stderr and "transports that cross hosts: tcp, udp" in done.stderr
    assert not out.exists()
    if dpdk_unavailable() is None:
        done = cluster.rlbench(0, *run_args(cluster, out, "--transport", "dpdk", "--dpdk-port", "memif",
                                            "--steps", "500", *spread(cluster)))
        assert done.returncode == 2 and "memif port links processes of one host" in done.stderr, done.stderr[-2000:]


def test_ctrl_c_stops_every_role_on_every_node(cluster, tmp_path):
    out = tmp_path / "result.json"
    proc = cluster.popen_rlbench(0, *run_args(cluster, out, "--transport", "tcp", "--steps", "1000000",
                                              *spread(cluster)))
    try:
        wait_for_roles(cluster, {(1, "rlb-replay"), (0, "rlb-learner"), (2, "rlb-actor-1")}, proc)
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)  # `ip netns exec` execs: this is rlbench itself
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "incomplete" and result["status_reason"] == "interrupted (Ctrl-C)"
    assert result["accounting"]["balanced"]


def test_an_actor_lost_with_its_node_is_replaced_on_a_live_node_and_the_run_finishes_with_two(cluster, tmp_path):
    """Issue #24: with --actor-restarts, the actor of a lost node gets a new incarnation on the node
    with a free CPU, and the run ends with the actor count it started with."""
    out = tmp_path / "result.json"
    proc = cluster.popen_rlbench(0, *run_args(cluster, out, "--transport", "tcp", "--steps", "8000",
                                              "--actor-restarts", "1", *spread(cluster)))
    try:
        wait_for_roles(cluster, {(2, "rlb-actor-1"), (1, "rlb-actor-0")}, proc)
        time.sleep(2.0)
        cluster.kill_process(2, "raylet")  # node c is lost, and actor-1 with it
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "complete", result["status_reason"]
    failures = result["loop"]["failures"]
    assert any(f.startswith("actor-1") and cluster.ips[2] in f for f in failures), failures
    assert result["throughput"]["env_steps"] >= 8000
    assert result["accounting"]["balanced"]
    roles = result["loop"]["roles"]
    assert roles["actor-1"]["host"] == cluster.ips[2]
    [incarnation] = result["loop"]["actor_incarnations"]
    assert incarnation["slot"] == "actor-1" and incarnation["replaced_by"] == "actor-2"
    assert roles["actor-2"]["host"] == cluster.ips[0]  # the live node with a CPU free (b holds replay and actor-0)
    assert roles["actor-2"]["produced"] > 0 and roles["actor-0"]["produced"] > 0  # two actors to the end


def test_losing_the_replay_nodes_node_stops_the_run_with_a_result(cluster, tmp_path):
    out = tmp_path / "result.json"
    proc = cluster.popen_rlbench(0, *run_args(cluster, out, "--transport", "tcp", "--steps", "1000000", "--actors", "1",
                                              *spread(cluster, actors=(0,))))  # node c is gone: a takes the actor
    t0 = time.monotonic()
    try:
        wait_for_roles(cluster, {(1, "rlb-replay"), (0, "rlb-actor-0")}, proc)
        time.sleep(2.0)
        cluster.kill_process(1, "raylet")  # node b is lost, and the replay node with it
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in stderr, stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "incomplete" and "replay node" in result["status_reason"], result["status_reason"]
    assert result["accounting"]["balanced"]
    assert time.monotonic() - t0 < 180
