"""Issue #24: roles sized to their cores, the time split on the CPU clock, weights that cost what they
must, actors that are replaced when they die."""

from __future__ import annotations

import numpy as np
import pytest

from support import kill_role_when_running, served
from rlbench.config import RunConfig
from rlbench.metrics import CpuMeter, Recorder, time_split
from rlbench.runner import run
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.channel import Channel
from rlbench.runtime.distributed.messages import Op, encode, role_key

SHORT = {"learning_starts": 200, "batch_size": 32}


def short(**kw) -> RunConfig:
    values = dict(placement="server", transport="tcp", actors=2, steps=4000, eval_episodes=1,
                  hyperparameters=dict(SHORT))
    values.update(kw)
    return RunConfig(**values)


# ------------------------------------------------------------------------- roles sized to their cores
def test_every_role_runs_its_thread_pools_at_the_cpus_it_was_given_and_says_so(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # what a user's shell may say: each role still gets its 1
    result = run(short(steps=2000))
    assert result["status"] == "complete"
    for name in ("replay", "learner", "actor-0", "actor-1"):
        threads = result["loop"]["roles"][name]["threads"]
        assert threads["OMP_NUM_THREADS"] == "1" and threads["OPENBLAS_NUM_THREADS"] == "1", (name, threads)
        assert threads["pools"] and set(threads["pools"].values()) == {1}, (name, threads)  # the loaded pools too
    assert result["loop"]["roles"]["learner"]["threads"]["torch_threads"] == 1


def test_the_time_split_counts_only_cpu_time_outside_every_category_as_bookkeeping():
    """A role descheduled or blocked (here: asleep) is waiting, not doing rlbench's bookkeeping."""
    import time

    recorder, cpu = Recorder(), CpuMeter()
    started = time.perf_counter()
    time.sleep(0.3)  # off the CPU: before, this counted as bookkeeping
    spin = time.thread_time() + 0.1
    while time.thread_time() < spin:  # 0.1 s of this thread's work inside a category
        pass
    cpu.add("env", 0.1e9)
    recorder.histogram("env.step").record(int(0.1e9))
    split = time_split(recorder, time.perf_counter() - started, {"env.step": "env"}, None, cpu)
    assert split["waiting"] >= 0.28  # the sleep (and whatever time the machine took the CPU away)
    assert split["bookkeeping"] < 0.03 and split["bookkeeping_share"] < 0.3
    assert split["cpu_s"] == pytest.approx(0.1, abs=0.03)


def test_a_run_reports_each_roles_cpu_and_waiting_beside_its_wall_time():
    result = run(short(steps=3000))
    roles_cpu_s = sum(role["cpu_s"] for role in result["loop"]["roles"].values())
    assert result["timing"]["cpu_s"] >= roles_cpu_s > 0  # the run counts its roles' CPU (not its children)
    assert result["machine_state"]["own_cpu_s"] >= roles_cpu_s  # and never takes its roles for other processes
    for name, split in result["loop"]["time_split"].items():
        assert split["cpu_s"] > 0 and split["waiting"] >= 0, name
        assert split["cpu_s"] + split["waiting"] == pytest.approx(split["window_s"], rel=0.05, abs=0.01), name
        assert split["bookkeeping"] <= split["cpu_s"], name
    assert 0 <= result["bookkeeping_share"] < 1


def test_the_cpu_an_actor_spends_waiting_for_its_inserts_reply_counts_as_replay():
    # shm's receive spins before it sleeps: the CPU of that wait belonged to nobody, so over shm each
    # actor's 0.8 s of it showed as rlbench's bookkeeping (6.0 % of the roles' CPU; 3.2 % over tcp)
    import time

    from rlbench.runtime.distributed.replay_client import ReplayClient
    from rlbench.runtime.transitions import transition

    reply = {"produced": np.int64(4), "params_version": np.int64(0), "learner_updates": np.int64(0),
             "finished": np.int64(0)}

    class SpinningChannel:
        recorder = Recorder()

        def begin(self, op, arrays):
            return object()

        def finish(self, request):
            spin_until = time.thread_time() + 0.004
            while time.thread_time() < spin_until:
                pass
            return Op.INSERTED, reply

    client = ReplayClient(SpinningChannel())
    rows = transition(np.zeros((4, 4), np.float32), np.zeros(4, np.int64), np.zeros(4, np.float32),
                      np.zeros((4, 4), np.float32), np.zeros(4, np.float32))
    for _ in range(68):  # the clock is read on one call in CPU_SAMPLE_EVERY (17): 4 of the finishes, each counted 17 times
        client.add_finish(client.add_begin(rows, produced=4))
    assert client.cpu_s()["replay"] == pytest.approx(68 * 0.004, rel=0.25)


# ------------------------------------------------------------------------------------------ weights
def test_the_weights_are_encoded_once_per_version_whoever_fetches_them(monkeypatch):
    with served("tcp") as (transport, listener, node):
        learner = Channel(transport.connect(listener.address), timeout=10)
        learner.authenticate("learner", 0, role_key(node.settings.secret, "learner", 0))
        learner.send(Op.PUBLISH_PARAMS, messages.weights_arrays([np.arange(12, dtype=np.float32).reshape(3, 4)], 7))
        actors = []
        for index in range(3):
            actor = Channel(transport.connect(listener.address), timeout=10)
            actor.authenticate("actor", index, role_key(node.settings.secret, "actor", index))
            actors.append(actor)
        actors[0].request(Op.STATUS)  # the publication has been handled
        from rlbench.runtime.distributed import replay_node

        encoded = []
        monkeypatch.setattr(replay_node.messages, "encode", lambda *a, **k: encoded.append(a) or encode(*a, **k))
        for actor in actors:
            for _ in range(5):
                op, arrays = actor.request(Op.FETCH_PARAMS, {"have_version": np.int64(-1)})
                version, weights = messages.read_weights(arrays)
                assert op == Op.PARAMS and version == 7
                np.testing.assert_array_equal(weights[0], np.arange(12, dtype=np.float32).reshape(3, 4))
        assert [a for a in encoded if a[0] == Op.PARAMS] == []  # 15 replies, no encoding
        for channel in (learner, *actors):
            channel.close()


def test_by_default_the_learner_publishes_every_50_updates_so_its_bytes_stay_small():
    from rlbench.algorithms.ddpg import DDPGConfig
    from rlbench.algorithms.dqn import DQNConfig

    assert DQNConfig().publish_every == DDPGConfig().publish_every == 50
    result = run(short(steps=6000, actors=1, hyperparameters={**SHORT, "train_every": 1}))
    learner = result["loop"]["roles"]["learner"]
    updates, publications = learner["updates"], result["latency"]["weights.PUBLISH"]["count"]
    assert publications <= updates // 50 + 2  # every 50 updates, the first and the last
    weights_bytes = result["loop"]["roles"]["actor-0"]["link"]["bytes_received"]
    assert learner["link"]["bytes_sent"] < 50 * weights_bytes  # not a policy per update


# --------------------------------------------------------------------------------------- restarts
def test_an_actor_that_dies_is_replaced_and_what_it_stored_stays_counted():
    killed: list = []
    kill_role_when_running("rlb-actor-0", after_s=3.0, killed=killed)
    result = run(short(steps=60_000, actor_restarts=1, hyperparameters={**SHORT, "train_every": 8}))
    assert killed, "actor-0 was never seen running"
    assert result["status"] == "complete", result["status_reason"]
    incarnations = result["loop"]["actor_incarnations"]
    assert incarnations == [{"slot": "actor-0", "died": "actor-0", "why": incarnations[0]["why"],
                             "replaced_by": "actor-2"}]
    roles = result["loop"]["roles"]
    assert roles["actor-2"]["produced"] > 0 and roles["actor-1"]["produced"] > 0
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["produced"] >= 60_000
    assert result["throughput"]["env_steps"] >= 60_000


def test_actor_restarts_are_refused_where_there_are_no_actor_processes():
    from rlbench.errors import RlbenchError
    from rlbench.plugins import get_registry
    from rlbench.runner import check

    with pytest.raises(RlbenchError, match="--actor-restarts replaces actor processes of a distributed run"):
        check(RunConfig(actor_restarts=1), get_registry())
    with pytest.raises(RlbenchError, match="--actor-restarts must be at least 0"):
        check(short(actor_restarts=-1), get_registry())


# ------------------------------------------------------------------- where a replacement actor goes
def test_a_replacement_actor_goes_where_place_puts_actors_on_a_node_with_a_cpu_free():
    """Issue #41 item 4: --place actors= holds for a replacement (it went to the node with the most CPUs
    free, the replay node's host, while the named host was alive), but never onto a full node, where Ray
    would not start it; the dead actor's node comes last among equals."""
    from rlbench.cluster.ray import Node
    from rlbench.runtime.launchers.ray import ROLE_CPUS, replacement_node

    def node(name: str, cpus: float) -> Node:
        return Node(name, f"10.0.0.{len(name)}", name, {"CPU": cpus}, {})

    replay_host, named, other = node("replay", 8.0), node("actors", 2.0), node("spare", 4.0)
    nodes = [replay_host, named, other]
    assert replacement_node(nodes, {"actors": 1.0}, {"actors"}, dead="actors") is named  # its own slot freed
    assert replacement_node(nodes, {"actors": 1.0}, set(), dead="actors") is replay_host  # nothing named: most free
    full = {"actors": 2.0 * ROLE_CPUS}
    assert replacement_node(nodes, full, {"actors"}, dead=None) is replay_host  # named but full: a CPU free first
    assert replacement_node([named, other], {}, {"actors", "spare"}, dead="actors") is other  # not the dead one's
