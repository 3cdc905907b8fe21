"""A Ray cluster of real hosts on one machine: network namespaces on a bridge, each with its own IP
and a Ray node started by `ray start` inside it (the head in the first), so every role of a run has
its own host address and what roles exchange crosses virtual links (veth pairs). For the tests and
`rlbench bench launchers --netns`. Needs root and `ip`.

Tear-down never uses `ray stop`: it kills by process name on the whole machine, other people's Ray
included. This cluster's processes are found by namespace (`ip netns pids`) and killed by pid; the
namespaces, the bridge and Ray's temporary directory are deleted, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rlbench.builtin.transports.ray_actors import SMALL_OBJECT_STORE_BYTES
from rlbench.errors import RlbenchError

VENV_BIN = Path(sys.executable).parent
NODE_CPUS = 2  # logical: enough for two roles per node
# Faster node-death detection than Ray's defaults (3 s x 5), so a lost node is seen within seconds.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 500,
                      "health_check_failure_threshold": 4, "health_check_timeout_ms": 500}
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


def namespaces_unavailable() -> str | None:
    """Why a namespace cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing: apt-get install iproute2"
    if not (VENV_BIN / "ray").exists():
        return "Ray is not installed (pip install ray)"
    return None


@dataclass
class NamespaceCluster:
    tag: str
    names: list[str]  # namespaces, the head's first
    ips: list[str]
    host_ends: list[str]  # each namespace's veth end on the bridge, in the root namespace
    bridge: str
    temp_dir: str
    port: int = 6380
    env: dict[str, str] = field(default_factory=dict)  # for every process of this cluster (its auth token)
    created: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.ips[0]}:{self.port}"

    def exec_args(self, index: int, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.names[index], *args]

    def run(self, index: int, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, **RAY_ENV, **self.env}
        done = subprocess.run(self.exec_args(index, *args), capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=os.getcwd())
        if check and done.returncode != 0:
            raise RlbenchError(f"{' '.join(args[:3])} in {self.names[index]} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout)[-3000:]}")
        return done

    def rlbench(self, index: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return self.run(index, str(VENV_BIN / "rlbench"), *args, timeout=timeout, check=False)

    def popen_rlbench(self, index: int, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.exec_args(index, str(VENV_BIN / "rlbench"), *args), cwd=os.getcwd(),
                                env={**os.environ, **RAY_ENV, **self.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def pids(self, index: int) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.names[index]], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    def kill_process(self, index: int, comm: str) -> int:
        """SIGKILL the first process named `comm` in that namespace (e.g. its raylet); its pid."""
        for pid in self.pids(index):
            if _comm(pid) == comm:
                os.kill(pid, signal.SIGKILL)
                return pid
        raise AssertionError(f"no {comm} process in {self.names[index]}")

    def role_threads(self) -> list[tuple[str, int, str]]:
        """(namespace, pid, thread name) of every rlbench role still running in the cluster."""
        found = []
        for index, name in enumerate(self.names):
            for pid in self.pids(index):
                for thread in _thread_names(pid):
                    if thread.startswith("rlb-"):
                        found.append((name, pid, thread))
        return found

    def tx_bytes(self, index: int) -> int:
        """Bytes namespace `index` sent onto the bridge (its veth end in the root namespace receives them)."""
        return int(Path(f"/sys/class/net/{self.host_ends[index]}/statistics/rx_bytes").read_text())


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _thread_names(pid: int) -> list[str]:
    try:
        return [_read(task / "comm") for task in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return []


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RlbenchError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@contextlib.contextmanager
def namespace_cluster(nodes: int = 3, cpus: int = NODE_CPUS,
                      cpusets: list[str | None] | None = None) -> Iterator[NamespaceCluster]:
    """`nodes` namespaces on one bridge (10.77.X.1.., X random), interface eth0 in each, a Ray head
    in the first and a worker in each other (custom resources rlb_a, rlb_b, ...); `cpusets[i]`, when
    given, pins node i (its raylet and every process it starts) to those cores (taskset). Everything
    is removed afterwards, whatever happened: every process in the namespaces killed, the namespaces,
    the bridge and Ray's temporary directory deleted."""
    tag = secrets.token_hex(2)
    subnet = f"10.77.{secrets.randbelow(200) + 20}"
    cluster = NamespaceCluster(tag, [f"rlbr{tag}{chr(97 + i)}" for i in range(nodes)],
                               [f"{subnet}.{i + 1}" for i in range(nodes)],
                               [f"rlbr{tag}{chr(97 + i)}h" for i in range(nodes)], f"rlbr{tag}br",
                               tempfile.mkdtemp(prefix="rlbray"))
    token = Path(cluster.temp_dir) / "auth_token"  # Ray's token authentication, with a token of this cluster's own
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    cluster.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    try:
        _ip("link", "add", cluster.bridge, "type", "bridge")
        cluster.created.append("bridge")
        _ip("link", "set", cluster.bridge, "up")
        for name, ip, host_end in zip(cluster.names, cluster.ips, cluster.host_ends):
            _ip("netns", "add", name)
            cluster.created.append(name)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", host_end, "master", cluster.bridge, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
        ray = str(VENV_BIN / "ray")

        def pinned(i: int) -> list[str]:
            return ["taskset", "-c", cpusets[i], ray] if cpusets and cpusets[i] is not None else [ray]

        common = [f"--num-cpus={cpus}", f"--object-store-memory={SMALL_OBJECT_STORE_BYTES}", "--disable-usage-stats"]
        cluster.run(0, *pinned(0), "start", "--head", f"--node-ip-address={cluster.ips[0]}", f"--port={cluster.port}",
                    "--include-dashboard=false", f"--temp-dir={cluster.temp_dir}",
                    f"--system-config={json.dumps(FAST_HEALTH_CHECKS)}", '--resources={"rlb_a": 1}', *common)
        for i in range(1, nodes):
            cluster.run(i, *pinned(i), "start", f"--address={cluster.address}", f"--node-ip-address={cluster.ips[i]}",
                        f'--resources={{"rlb_{chr(97 + i)}": 1}}', *common)
        _wait_for_nodes(cluster, nodes)
        yield cluster
    finally:
        _take_down(cluster)


def _wait_for_nodes(cluster: NamespaceCluster, nodes: int, timeout: float = 60) -> None:
    script = (f"import ray, time; ray.init(address={cluster.address!r}, logging_level='ERROR'); t=time.time()\n"
              f"while sum(n['Alive'] for n in ray.nodes()) < {nodes} and time.time()-t < {timeout}: time.sleep(0.2)\n"
              "print(sum(n['Alive'] for n in ray.nodes()))")
    done = cluster.run(0, sys.executable, "-c", script, timeout=timeout + 30)
    joined = (done.stdout.split() or ["0"])[-1]
    if joined != str(nodes):
        raise RlbenchError(f"only {joined} of {nodes} Ray nodes joined the namespace cluster within {timeout:.0f} s")


def _take_down(cluster: NamespaceCluster) -> None:
    for _ in range(3):  # processes may start others while we kill (a raylet its workers)
        pids = [pid for index, name in enumerate(cluster.names) if name in cluster.created for pid in cluster.pids(index)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
    for name in cluster.names:
        if name in cluster.created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for host_end in cluster.host_ends:
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
    if "bridge" in cluster.created:
        subprocess.run(["ip", "link", "del", cluster.bridge], capture_output=True)
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
