"""The replay node against hostile and unlucky peers (issue #13): no single message kills, stalls or
bloats it; only the run's own roles may talk to it; a run that stops early keeps every report;
schedulers' signals stop a run in order. Transport-level defences are in test_transport_hardening.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from support import REPO, SECRET, kill_role_when_running, read_terminal, rlb_processes, served, valid_insert
from rlbench.config import RunConfig
from rlbench.runner import run
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.channel import Channel, RemoteError
from rlbench.runtime.distributed.messages import SCHEMAS, Op, decode, encode, joined, read_text
from rlbench.runtime.distributed.replay_node import MAX_ERRORS_BEFORE_AUTH

SHORT = {"learning_starts": 200, "batch_size": 32, "publish_every": 5}
TRANSPORTS = ["inproc", "shm", "tcp", "udp"]


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def connected(transport, listener, role="actor", secret=SECRET, index=0) -> Channel:
    channel = Channel(transport.connect(listener.address), timeout=10)
    channel.authenticate(role, index, messages.role_key(secret, role, index))
    return channel


def answer_then_status(connection, message: bytes, probe_id: int) -> list:
    """Send a (maybe hostile) message, then STATUS; every reply up to STATUS's, as (op, request id)."""
    connection.send(message)
    connection.send(*encode(Op.STATUS, {}, probe_id))
    replies = []
    while True:
        reply = connection.recv(timeout=10)
        assert reply is not None, "the node stopped answering"
        op, request_id, _ = decode(reply)
        replies.append((op, request_id))
        if request_id == probe_id:
            return replies


# ------------------------------------------------------------------------ messages: never fatal
def valid_message(op: Op) -> dict:
    """A valid body of each op a peer may send (replies included: the node must refuse those too)."""
    rows = valid_insert(4)
    weights = {"version": np.int64(3), "w0": np.ones((4, 2), np.float32), "w1": np.ones(2, np.float32)}
    bodies = {
        Op.HELLO: {"role": messages.text("actor"), "index": np.int64(0), "nonce": np.zeros(16, np.uint8)},
        Op.CHALLENGE: {"nonce": np.zeros(16, np.uint8), "proof": np.zeros(32, np.uint8)},
        Op.AUTH: {"proof": np.zeros(32, np.uint8)},
        Op.INSERT: rows,
        Op.INSERTED: {"produced": np.int64(1), "params_version": np.int64(1), "learner_updates": np.int64(1),
                      "finished": np.uint8(0)},
        Op.SAMPLE: {"batch_size": np.int64(4), "beta": np.float64(0.4)},
        Op.BATCH: {**{k: v for k, v in rows.items() if k != "produced"}, "indices": np.arange(4),
                   "weights": np.ones(4, np.float32), "step": np.int64(1)},
        Op.END: {"finished": np.uint8(1)},
        Op.UPDATE_PRIORITIES: {"indices": np.arange(2), "priorities": np.ones(2), "learner_updates": np.int64(1)},
        Op.CREDIT: {"credit": np.int64(1), "beta": np.float64(0.4)},
        Op.PUBLISH_PARAMS: weights,
        Op.FETCH_PARAMS: {"have_version": np.int64(-1)},
        Op.PARAMS: weights,
        Op.CURRENT: {"finished": np.uint8(0)},
        Op.STATE: {"finished": np.uint8(0), "produced": np.int64(0), "stored": np.int64(0),
                   "params_version": np.int64(0), "learner_updates": np.int64(0), "actors": np.int64(0),
                   "done_reason": messages.text("")},
        Op.REPORT: {"json": messages.json_array({})},
        Op.BYE: {"report": messages.json_array({"x": 1})},
        Op.ERROR: {"message": messages.text("no")},
        Op.FINISH: {"reason": messages.text("because")},
    }
    return bodies.get(op, {})


def mutations(op: Op, body: dict, rng: np.random.Generator):
    """Structure-aware mutations of one op's body: each field dropped, retyped, reshaped, enlarged,
    set to extreme values; an extra field; plus a few byte flips of the encoded message."""
    for name, value in body.items():
        value = np.asarray(value)
        yield {k: v for k, v in body.items() if k != name}
        yield {**body, name: value.astype(np.float64) if value.dtype.kind != "f" else value.astype(np.int64)}
        yield {**body, name: np.zeros((2, 3, 5), value.dtype)}
        yield {**body, name: np.full(value.shape or (), np.iinfo(np.uint64).max, np.uint64)}
        yield {**body, name: np.full(value.shape or (), -(2 ** 62), np.int64)}
        yield {**body, name: np.full(value.shape or (), np.nan)}
        yield {**body, name: np.zeros(1 << 16, np.uint8)}
    yield {**body, "intruder": np.zeros(3)}
    good = bytearray(joined(encode(op, body, 7)))
    for _ in range(6):
        flipped = bytearray(good)
        for position in rng.integers(4, len(flipped), size=3):  # the op stays, so a flip never turns into SHUTDOWN
            flipped[position] = rng.integers(0, 256)
        yield bytes(flipped)


@pytest.mark.parametrize("transport_name", TRANSPORTS)
def test_structure_aware_fuzz_of_every_op_never_stops_or_bloats_the_node(transport_name):
    rng = np.random.default_rng(13)
    with served(transport_name, max_message_bytes=4 << 20) as (transport, listener, node):
        learner = connected(transport, listener, "learner")
        actor = connected(transport, listener, "actor")
        actor.request(Op.INSERT, valid_insert(64))
        before = rss_bytes()
        sent = 0
        probe = 1000
        for op in SCHEMAS:
            if op in (Op.SHUTDOWN, Op.FINISH):  # the launcher's: valid ones would end the node
                continue
            for mutated in mutations(op, valid_message(op), rng):
                message = mutated if isinstance(mutated, bytes) else joined(encode(op, mutated, 7))
                for connection in (actor.connection, learner.connection):
                    probe += 1
                    replies = answer_then_status(connection, message, probe)
                    assert replies[-1][0] == Op.STATE
                    sent += 1
        grown = rss_bytes() - before
        assert grown < 64 << 20, f"the node's process grew {grown >> 20} MiB over {sent} hostile messages"
        # it still serves its roles (on new connections: a fuzzed BYE may have been valid and ended the old ones)
        actor.close()
        learner.close()
        actor = connected(transport, listener, "actor", index=1)
        learner = connected(transport, listener, "learner")
        assert actor.request(Op.INSERT, valid_insert(4))[0] == Op.INSERTED
        op, arrays = learner.request(Op.SAMPLE, {"batch_size": np.int64(8), "beta": np.float64(0.5)})
        assert op == Op.BATCH and arrays["obs"].shape == (8, 4)
        counters = node.recorder.counters
        assert counters["malformed"] > 100 and counters["forbidden"] > 10 and node.serving()
        actor.close()
        learner.close()


@pytest.mark.parametrize("transport_name", ["tcp", "udp"])
def test_random_bytes_from_an_unauthenticated_peer_are_answered_until_it_is_dropped_and_counted(transport_name):
    """A stranger gets MAX_ERRORS_BEFORE_AUTH refusals per connection, then the node drops it: its
    flood costs the node a bounded amount, and the node goes on serving."""
    rng = np.random.default_rng(2)
    with served(transport_name) as (transport, listener, node):
        stranger = transport.connect(listener.address)
        answered = dropped = 0
        for i in range(200):
            size = int(rng.integers(0, 300))
            try:
                replies = answer_then_status(stranger, rng.bytes(size), 5000 + i)
            except ConnectionError:  # dropped: a new connection starts with a new allowance
                dropped += 1
                stranger.close()
                stranger = transport.connect(listener.address)
                continue
            assert replies[-1][0] == Op.ERROR  # STATUS before authentication: refused too
            answered += 1
        per_connection = MAX_ERRORS_BEFORE_AUTH // 2  # two refusals a round
        assert dropped == 200 // (per_connection + 1) and answered == 200 - dropped
        counters = node.recorder.counters
        assert counters["malformed"] + counters["unauthenticated"] >= 2 * answered + dropped
        assert counters["dropped_before_auth"] == dropped
        assert node.state.stored == 0 and node.serving()
        actor = connected(transport, listener, "actor")
        assert actor.request(Op.INSERT, valid_insert(4))[0] == Op.INSERTED
        stranger.close()
        actor.close()


# ------------------------------------------------------------------- well-formed but hostile
def test_an_impossible_sample_is_refused_and_blocks_no_other():
    with served("tcp", capacity=1000) as (transport, listener, node):
        actor = connected(transport, listener, "actor")
        learner = connected(transport, listener, "learner")
        actor.request(Op.INSERT, valid_insert(10))
        with pytest.raises(RemoteError, match="batch_size 5000 exceeds the memory's capacity 1000"):
            learner.request(Op.SAMPLE, {"batch_size": np.int64(5000), "beta": np.float64(0.4)})
        with pytest.raises(RemoteError, match=r"batch_size = 1099511627776 is outside"):
            learner.request(Op.SAMPLE, {"batch_size": np.int64(1 << 40), "beta": np.float64(0.4)})
        with pytest.raises(RemoteError, match=r"beta = 2.0 is outside \[0, 1\]"):
            learner.request(Op.SAMPLE, {"batch_size": np.int64(4), "beta": np.float64(2.0)})
        # a request that can wait (more than is stored) does not hold back one that can be served
        waiting = learner.begin(Op.SAMPLE, {"batch_size": np.int64(500), "beta": np.float64(0.4)})
        op, arrays = learner.request(Op.SAMPLE, {"batch_size": np.int64(4), "beta": np.float64(0.4)})
        assert op == Op.BATCH and len(arrays["indices"]) == 4
        actor.request(Op.INSERT, valid_insert(600))
        assert learner.finish(waiting)[0] == Op.BATCH
        actor.close()
        learner.close()


def test_a_bye_whose_report_is_a_list_and_an_insert_claiming_2_to_the_64_are_refused():
    with served("tcp") as (transport, listener, node):
        actor = connected(transport, listener, "actor")
        with pytest.raises(RemoteError, match="must be a JSON object, got list"):
            actor.request(Op.BYE, {"report": messages.text("[1, 2, 3]")})
        with pytest.raises(RemoteError, match="produced = 18446744073709551615 is outside"):
            actor.request(Op.INSERT, {**valid_insert(4), "produced": np.uint64(2 ** 64 - 1)})
        assert node.state.produced == 0 and node.serving()
        assert actor.request(Op.INSERT, valid_insert(4))[0] == Op.INSERTED
        actor.close()


# ----------------------------------------------------------------------- only the run's roles
def test_without_the_secret_nothing_is_accepted_and_the_refusals_are_counted():
    with served("tcp") as (transport, listener, node):
        stranger = Channel(transport.connect(listener.address), timeout=10)
        for op, body in ((Op.INSERT, valid_insert(4)), (Op.SHUTDOWN, {}), (Op.PUBLISH_PARAMS, valid_message(Op.PARAMS)),
                         (Op.SAMPLE, valid_message(Op.SAMPLE))):
            with pytest.raises(RemoteError, match="before authentication"):
                stranger.request(op, body)
        with pytest.raises(RemoteError, match="could not prove the run's secret"):  # the node's proof fails for us
            stranger.authenticate("actor", 0, b"x" * 32)
        # answering the node's challenge without the secret: refused, and the connection is done
        wrong = Channel(transport.connect(listener.address), timeout=10)
        op, challenge = wrong.request(Op.HELLO, valid_message(Op.HELLO))
        assert op == Op.CHALLENGE
        with pytest.raises(RemoteError, match="authentication failed"):
            wrong.request(Op.AUTH, {"proof": np.zeros(32, np.uint8)})
        counters = node.recorder.counters
        assert counters["unauthenticated"] == 4 and counters["auth_failed"] == 1
        assert node.state.stored == 0 and node.state.params_version == -1 and node.serving()
        stranger.close()
        wrong.close()


def test_roles_may_send_only_their_own_ops():
    with served("tcp") as (transport, listener, node):
        actor = connected(transport, listener, "actor")
        learner = connected(transport, listener, "learner")
        for op in (Op.SHUTDOWN, Op.PUBLISH_PARAMS, Op.SAMPLE, Op.FINISH, Op.STATS):
            with pytest.raises(RemoteError, match=f"does not accept {op.name} from a actor"):
                actor.request(op, valid_message(op if op != Op.PUBLISH_PARAMS else Op.PARAMS))
        with pytest.raises(RemoteError, match="does not accept INSERT from a learner"):
            learner.request(Op.INSERT, valid_insert(4))
        assert node.recorder.counters["forbidden"] == 6 and node.serving()
        actor.close()
        learner.close()


def test_a_client_refuses_a_node_that_cannot_prove_the_secret():
    with served("tcp", secret=b"t" * 32) as (transport, listener, node):
        with pytest.raises(RemoteError, match="could not prove the run's secret: refusing to talk to it"):
            connected(transport, listener, "actor", secret=SECRET)
    with served("tcp", secret=None) as (transport, listener, node):
        with pytest.raises(RemoteError, match="runs without authentication but this role has a key"):
            connected(transport, listener, "actor", secret=SECRET)


INTRUDER = r"""
import json, os, socket, sys, time
import numpy as np
from rlbench.plugins import get_registry
from rlbench.runtime.distributed.channel import Channel, RemoteError
from rlbench.runtime.distributed.messages import Op, text

import encodings.idna  # noqa: F401  (needed after the switch of user: this Python's files are root's)
transport_name, address, uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
transport = get_registry().get("transport", transport_name).create()
from rlbench.runtime.distributed import messages  # noqa: F401  (imported while we may still read it)
if uid:
    os.setgid(uid); os.setuid(uid)  # another user, as the issue found it
outcomes = {}
rows = 128
attempts = {
    "insert": (Op.INSERT, {"obs": np.zeros((rows, 4), np.float32), "action": np.zeros(rows, np.int64),
                           "reward": np.full(rows, 1e6, np.float32), "next_obs": np.zeros((rows, 4), np.float32),
                           "done": np.zeros(rows, np.float32), "produced": np.int64(rows)}),
    "publish": (Op.PUBLISH_PARAMS, {"version": np.int64(10**9), "w0": np.zeros((4, 2), np.float32)}),
    "shutdown": (Op.SHUTDOWN, {}),
}
for name, (op, body) in attempts.items():
    try:
        channel = Channel(transport.connect(address, timeout=5), timeout=5, retries=1)
        try:
            channel.request(op, body)
            outcomes[name] = "accepted"
        except RemoteError as exc:
            outcomes[name] = str(exc)
        channel.close()
    except Exception as exc:  # refused at the transport (shm: another uid)
        outcomes[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(outcomes))
"""


def listening_address(transport_name: str) -> str:
    """The address the run's replay node listens on, found from outside as an intruder would."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = [pid for pid, name in rlb_processes() if name == "rlb-replay"]
        if nodes:
            inodes = set()
            for fd in Path(f"/proc/{nodes[0]}/fd").iterdir():
                target = os.readlink(fd) if fd.is_symlink() else ""
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
            if transport_name == "shm":
                for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
                    fields = line.split()
                    if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith("@rlbench-shm/"):
                        return "shm://" + fields[7][len("@rlbench-shm/"):]
            else:
                table = "tcp" if transport_name == "tcp" else "udp"
                for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[9] in inodes and (table == "udp" or fields[3] == "0A"):
                        port = int(fields[1].split(":")[1], 16)
                        return f"{transport_name}://127.0.0.1:{port}"
        time.sleep(0.1)
    raise AssertionError("never found the replay node's address")


@pytest.mark.parametrize("transport_name, uid", [("tcp", 65534), ("udp", 0), ("shm", 65534), ("shm", 0)])
def test_an_intruder_without_the_secret_changes_nothing_in_a_run(transport_name, uid):
    if uid and os.geteuid() != 0:
        pytest.skip("running the intruder as another user needs root")
    import threading

    outcome: dict = {}

    def intrude():
        address = listening_address(transport_name)
        time.sleep(1.0)
        done = subprocess.run([sys.executable, "-c", INTRUDER, transport_name, address, str(uid)], capture_output=True,
                              text=True, timeout=60, cwd=REPO)
        outcome["stdout"], outcome["stderr"] = done.stdout, done.stderr

    thread = threading.Thread(target=intrude, daemon=True)
    thread.start()
    result = run(RunConfig(placement="server", transport=transport_name, actors=2, steps=20000, eval_episodes=0,
                           hyperparameters={**SHORT, "train_every": 4}))  # long enough for the intruder, light learner
    thread.join(timeout=60)
    assert outcome.get("stdout"), outcome.get("stderr")
    attempts = json.loads(outcome["stdout"])
    assert "accepted" not in attempts.values(), attempts
    assert result["status"] == "complete", result["status_reason"]  # SHUTDOWN was refused: the run went on
    accounting = result["accounting"]
    actors = [role for name, role in result["loop"]["roles"].items() if name.startswith("actor-")]
    assert accounting["balanced"] and accounting["produced"] == sum(a["produced"] for a in actors)
    assert accounting["stored"] == sum(a["sent"] for a in actors)  # nothing the intruder sent was stored
    counters = result["counters"]
    refused = sum(counters.get(f"replay.{name}", 0) for name in ("unauthenticated", "auth_failed"))
    if transport_name == "shm" and uid:
        assert all("TransportClosedError" in text or "refused" in text for text in attempts.values()), attempts
    else:
        assert refused >= 3, (counters, attempts)


# -------------------------------------------------------------- a run that stops early keeps all
def short(**kw) -> RunConfig:
    settings = dict(placement="server", transport="tcp", steps=200_000, eval_episodes=0, hyperparameters=dict(SHORT))
    settings.update(kw)
    return RunConfig(**settings)


def test_an_actor_killed_under_stop_leaves_every_other_roles_report():
    killed: list = []
    kill_role_when_running("rlb-actor-0", after_s=5.0, killed=killed)
    result = run(short(actors=2, on_actor_failure="stop"))
    assert killed and result["status"] == "incomplete"
    assert result["status_reason"] == "actor-0 died and --on-actor-failure is stop"
    roles = result["loop"]["roles"]
    assert roles["actor-1"]["produced"] > 0 and roles["learner"]["updates"] > 0  # the survivors' own reports
    assert result["throughput"]["updates"] == roles["learner"]["updates"] > 0
    assert result["learning_curve"], "the surviving actor's curve is in the result"
    assert [f for f in result["loop"]["failures"] if not f.startswith("actor-0")] == []
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["produced"] >= roles["actor-1"]["produced"]


def test_a_killed_learner_leaves_the_actors_reports_and_exact_accounting():
    killed: list = []
    kill_role_when_running("rlb-learner", after_s=5.0, killed=killed)
    result = run(short(actors=2))
    assert killed and "learner died" in result["status_reason"]
    roles = result["loop"]["roles"]
    actors = [roles[f"actor-{i}"] for i in range(2)]
    assert all(a["produced"] > 0 for a in actors)
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["produced"] == sum(a["produced"] for a in actors)


def test_a_killed_replay_node_leaves_accounting_of_what_was_produced():
    killed: list = []
    kill_role_when_running("rlb-replay", after_s=5.0, killed=killed)
    result = run(short(actors=2))
    assert killed and "replay node died" in result["status_reason"]
    accounting = result["accounting"]
    assert accounting["produced"] > 1000 and accounting["balanced"]  # not "produced 0 = stored 0 + dropped 0"
    assert accounting["stored"] > 0 and len(result["status_reason"]) < 300
    roles = result["loop"]["roles"]
    assert all(roles[f"actor-{i}"]["lost"].startswith("lost the replay node") for i in range(2))


def test_a_replay_node_lost_before_the_first_weights_is_reported_as_lost_by_the_actors(monkeypatch):
    from rlbench.runtime import launchers as launcher

    monkeypatch.setitem(launcher.ROLE_FUNCTIONS, "learner", "support:silent_learner_role")
    killed: list = []
    kill_role_when_running("rlb-replay", after_s=3.0, killed=killed)
    result = run(short(actors=2))
    assert killed and "replay node died" in result["status_reason"]
    roles = result["loop"]["roles"]
    for i in range(2):  # not a failure of the actor ("TransportClosedError"), a loss it reports
        assert roles[f"actor-{i}"]["lost"].startswith("lost the replay node"), roles[f"actor-{i}"]
        assert roles[f"actor-{i}"]["produced"] == 0 and roles[f"actor-{i}"]["weights_version"] == -1
    assert result["accounting"]["produced"] == 0 and result["accounting"]["balanced"]


def test_a_stop_reason_is_one_line_even_when_a_role_exits_cleanly_with_a_large_report(monkeypatch):
    from rlbench.runtime import launchers as launcher

    monkeypatch.setitem(launcher.ROLE_FUNCTIONS, "learner", "support:big_report_role")
    result = run(short(actors=1, steps=4000))
    assert result["status"] == "incomplete"
    reason = result["status_reason"]
    assert "\n" not in reason and len(reason) < 300 and "blob" not in reason, reason


# ------------------------------------------------------------------------ schedulers' signals
@pytest.mark.parametrize("signum, code, reason", [(signal.SIGTERM, 143, "stopped by SIGTERM"),
                                                  (signal.SIGHUP, 129, "stopped by SIGHUP")])
def test_sigterm_and_sighup_stop_a_run_in_order_and_write_its_result(tmp_path, signum, code, reason):
    import pty
    import re

    import rlbench
    from rlbench.runtime.distributed.roles import actors_lead

    out = tmp_path / "result.json"
    # stderr on a terminal, so the run draws its progress: the signal goes once the actors are past
    # the steps the rate limiter lets them make before the learner's first updates (an event: a fixed
    # 6 s sleep saw no update on a loaded machine)
    hp = rlbench.get_registry().get("algorithm", "dqn").create().Config(learning_starts=200, batch_size=32)
    past_the_lead = actors_lead(hp, 2) + 8 * hp.train_every
    terminal, its_other_end = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rlbench", "run", "--placement", "server", "--transport", "tcp",
                             "--actors", "2", "--steps", "1000000", "--eval-episodes", "0", "--out", str(out),
                             "--hp", "learning_starts=200", "--hp", "batch_size=32"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=its_other_end, text=True)
    os.close(its_other_end)

    def learning(shown: str) -> bool:
        steps = re.findall(r"([0-9,]+)/1,000,000 steps", shown)
        return bool(steps) and int(steps[-1].replace(",", "")) > past_the_lead

    try:
        stderr = read_terminal(terminal, until=learning, process=proc, cap_s=300)  # a cap, not a speed
        assert learning(stderr), f"the run never got past {past_the_lead:,.0f} steps: {stderr[-2000:]}"
        proc.send_signal(signum)
        stderr += read_terminal(terminal, until=lambda shown: False, process=proc, cap_s=90)
        proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(terminal)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    saved = json.loads(out.read_text())
    assert saved["status"] == "incomplete" and saved["status_reason"] == reason
    assert saved["accounting"]["balanced"] and saved["loop"]["roles"]["learner"]["updates"] > 0
    deadline = time.monotonic() + 10
    while rlb_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rlb_processes() == []
