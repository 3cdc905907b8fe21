"""Helpers shared by the core tests (on sys.path through pytest's `pythonpath`)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def assert_training_reaches(curve: list[dict], threshold: float, window: int) -> None:
    """The mean of `window` consecutive training episodes reached `threshold` (time_to_threshold, the
    measure `rlbench report` uses); on failure, the message says how high it peaked."""
    import numpy as np

    from rlbench.bench.matrix import time_to_threshold

    returns = [p["return"] for p in curve]
    assert not np.isnan(time_to_threshold(curve, threshold, window)), (
        f"the mean of {window} training episodes never reached {threshold:g}: it peaked at "
        f"{max(np.convolve(returns, np.ones(window) / window, 'valid'), default=float('nan')):.1f} "
        f"over {len(curve)} episodes")


def write_plugin_dist(root: Path, dist: str, entry_name: str, module: str, source: str) -> Path:
    """A real installed distribution on disk (dist-info + entry point), found by importlib.metadata
    when `root` is on sys.path — the same path a pip-installed third-party plugin takes."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-0.0.1.dist-info"  # wheel naming: the stem holds the name
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[rlbench]\n{entry_name} = {module}\n")
    return root


def run_cli(*args: str, env_extra: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "rlbench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd or REPO)




def big_report_role(spec, announce=None):
    """A role for launcher tests: returns a report of `spec.total_steps` bytes."""
    return {"role": spec.role, "blob": "x" * spec.total_steps}


def environment_role(spec, announce=None):
    """A role for launcher tests: what it started with (torch already imported?), its environment
    and its thread pools."""
    import os
    import sys

    preloaded = "torch" in sys.modules
    from rlbench.machine_state import threads_in_use

    return {"torch_preloaded": preloaded, "mark": os.environ.get("RLBENCH_TEST_MARK"), "threads": threads_in_use()}


def silent_learner_role(spec, announce=None):
    """A learner for fault tests that never publishes weights: actors stay waiting for their first."""
    import time

    time.sleep(60)
    return {"role": "learner"}


def interrupt_when_ready(proc: "subprocess.Popen", ready, *, settle_s: float, timeout: float = 90) -> tuple[str, str]:
    """Wait until ready() (while the process lives), let it run `settle_s` more, press Ctrl-C, and
    return its output; kills it if it outlives `timeout`."""
    import signal
    import time

    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never got ready"
            time.sleep(0.1)
        time.sleep(settle_s)
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def replay_node_dying_at_the_end(spec, announce=None):
    """A replay node for launcher tests that dies, without a reply, when the launcher asks for its
    report (STATS): after the run, once every other role is done."""
    import os

    from rlbench.runtime.distributed import replay_node, roles
    from rlbench.runtime.distributed.messages import Op

    def die(node, peer_id, peer, request_id, arrays):
        os._exit(3)

    replay_node.ReplayNode._handlers = {**replay_node.ReplayNode._handlers, Op.STATS: die}
    return roles.replay_node_main(spec, announce)


def replay_node_whose_memory_fails(spec, announce=None):
    """A replay node for launcher tests whose memory's add raises as a broken memory would: not a
    refusal of the insert (an RlbenchError) but the memory itself failing (an OSError)."""
    from rlbench.builtin import replay
    from rlbench.runtime.distributed import roles

    def add(self, transitions, priorities=None):
        raise OSError("No space left on device")

    replay.UniformReplay.add = replay.PrioritizedReplay.add = add
    return roles.replay_node_main(spec, announce)


# ------------------------------------------------------------------------------ a node in a thread
SECRET = b"s" * 32


def valid_insert(n=8):
    import numpy as np

    return {"obs": np.ones((n, 4), np.float32), "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
            "next_obs": np.ones((n, 4), np.float32), "done": np.zeros(n, np.float32), "produced": np.int64(n)}


class _Served:
    """A replay node serving a uniform memory in a thread, over a built-in transport."""

    def __init__(self, transport_name, secret, capacity, transport_options=None, limiter=None, **settings):
        import threading

        from rlbench import get_registry
        from rlbench.runtime.distributed.rate_limiter import RateLimiter
        from rlbench.runtime.distributed.replay_node import NodeSettings, ReplayNode

        registry = get_registry()
        self.transport = registry.get("transport", transport_name).create(**(transport_options or {}))
        self.listener = self.transport.listen(None)
        memory = registry.get("replay", "uniform").create(capacity=capacity, alpha=0.6, seed=0)
        options = dict(placement="server", total_steps=10**9, batch_size=4, max_message_bytes=1 << 20, secret=secret)
        options.update(settings)
        self.node = ReplayNode(self.listener, memory, limiter or RateLimiter(1.0, 1, 1e9), NodeSettings(**options),
                               prioritized=False)
        self.node.serving = lambda: self.thread.is_alive()
        self.thread = threading.Thread(target=self.node.serve, daemon=True)
        self.thread.start()

    def stop(self):
        from rlbench.runtime.distributed.channel import Channel
        from rlbench.runtime.distributed.messages import Op, role_key

        control = Channel(self.transport.connect(self.listener.address), timeout=10)
        secret = self.node.settings.secret
        control.authenticate("launcher", 0, role_key(secret, "launcher", 0) if secret else None)
        control.request(Op.SHUTDOWN)
        self.thread.join(timeout=10)
        control.close()
        self.listener.close()
        assert not self.thread.is_alive(), "the replay node did not stop"


@contextlib.contextmanager
def served(transport_name, secret=SECRET, capacity=1000, transport_options=None, limiter=None, **settings):
    """(transport, listener, node) of a replay node serving in a thread; stopped afterwards."""
    server = _Served(transport_name, secret, capacity, transport_options, limiter, **settings)
    try:
        yield server.transport, server.listener, server.node
    finally:
        server.stop()


# --------------------------------------------------------------------------------- role processes
def rlb_processes() -> list[tuple[int, str]]:
    """Role processes started from this test process (others may run their own rlbench jobs)."""
    found, ours = [], {os.getpid(), *descendant_pids()}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                name = (entry / "comm").read_text().strip()
                status = (entry / "status").read_text()
            except OSError:
                continue
            parent = int(status.split("PPid:", 1)[1].split()[0])
            if name.startswith("rlb-") and parent in ours:
                found.append((int(entry.name), name))
    return found


def descendant_pids() -> list[int]:
    """Processes started under this one: the CLI subprocess of the Ctrl-C test launches roles, and
    roles are forked by the local launcher's fork server, its child."""
    found, parents = [], [os.getpid()]
    while parents:
        parent = parents.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            parents += children
    return found


def read_terminal(terminal: int, until, process: subprocess.Popen, cap_s: float) -> str:
    """What the process writes to the terminal `terminal` (a pty's master end, its stderr the other)
    until `until(text so far)` holds, the process ends, or cap_s passes. A command's progress shows
    only on a terminal: a test waits for the progress it needs there, not for a fixed time."""
    import select

    shown = ""
    cap = time.monotonic() + cap_s
    while not until(shown) and time.monotonic() < cap:
        if select.select([terminal], [], [], 0.1)[0]:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # EIO: every writer of the other end is gone
                break
            shown += chunk.decode(errors="replace")
        elif process.poll() is not None and not select.select([terminal], [], [], 0)[0]:
            break
    return shown


def kill_role_when_running(name: str, after_s: float, killed: list) -> threading.Thread:
    def worker():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pids = [pid for pid, comm in rlb_processes() if comm == name]
            if pids:
                time.sleep(after_s)
                try:
                    os.kill(pids[0], signal.SIGKILL)
                except ProcessLookupError:
                    return  # the run ended first: the test says "never seen running"
                killed.append(pids[0])
                return
            time.sleep(0.05)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    return thread


def semaphores_of_group(pgid: int) -> set[str]:
    """The named POSIX semaphores (/dev/shm/sem.*) that the processes of a process group have mapped."""
    named: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            maps = (entry / "maps").read_text()
        except (OSError, ProcessLookupError):
            continue  # gone meanwhile
        fields = (line.split(maxsplit=5) for line in maps.splitlines())
        named |= {f[5] for f in fields if len(f) == 6 and f[5].startswith("/dev/shm/sem.")}
    return named


def killed_mid_way(directory: Path, *args: str, at_env_steps: int, timeout: float = 120) -> dict:
    """`rlbench run ... --checkpoint-dir directory` in its own process group, SIGKILLed (every process of
    the run, at once) once a checkpoint past `at_env_steps` is complete; returns that checkpoint's record."""
    process = subprocess.Popen([sys.executable, "-m", "rlbench", "run", *args, "--checkpoint-dir", str(directory),
                                "--no-out"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert process.poll() is None, process.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint past the step in time"
            try:
                record = json.loads((directory / "LATEST").read_text())
            except (FileNotFoundError, ValueError):
                record = {"env_steps": -1}
            if record["env_steps"] >= at_env_steps:
                break
            time.sleep(0.05)
        time.sleep(0.3)  # into the next checkpoint's interval: killed at no particular moment
    finally:
        named = semaphores_of_group(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for path in named:  # SIGKILL took multiprocessing's resource tracker too: nobody else unlinks them
            Path(path).unlink(missing_ok=True)
    # issue #41 item 9: the local launcher's queues held six; a run holds no named semaphore now
    assert not named, f"a SIGKILLed run leaves its named semaphores in /dev/shm: {sorted(named)}"
    from rlbench.runtime import checkpoint

    return checkpoint.latest(directory)
