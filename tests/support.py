"""Helpers shared by the core tests (on sys.path through pytest's `pythonpath`)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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

    def die(node, peer, request_id, arrays):
        os._exit(3)

    replay_node.ReplayNode._handlers = {**replay_node.ReplayNode._handlers, Op.STATS: die}
    return roles.replay_node_main(spec, announce)
