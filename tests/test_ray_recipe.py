"""README.md's cluster recipe runs as written on Ray 2.60: its lines, read from README.md between the
`<!-- ray-recipe -->` markers (so the README and this test cannot drift), run on hosts that share
nothing but a network: network namespaces on a bridge, each with its own IP, default route, home
directory (so its own ~/.ray/auth_token) and Ray temporary directory, and a stale token of its own
already in ~/.ray/auth_token, as on any host where a Ray once started for a run. Each line runs on the
nodes its comment names, in a clean environment plus the `export` lines that host ran before; `scp`
copies from the named host's home (this simulation's network copy). Then rlbench joins from the
other node: without the recipe's `export RAY_AUTH_MODE=token` it is refused, saying what to do, and
with it a short run completes with roles on both hosts. Needs root and `ip`; everything started is
killed by namespace (never `ray stop`: it kills every Ray on the machine), whatever happens. Without
root: the recipe's order, and what rlbench says for each way a token can be missing or wrong."""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlbench.cluster.netns import VENV_BIN, NamespaceCluster, _ip, _take_down, namespaces_unavailable
from support import REPO

RECIPE = re.compile(r"<!-- ray-recipe\b[^>]*-->\n(.*?)\n<!-- /ray-recipe -->", re.S)
WHERE = re.compile(r"#\s*on (the head node|every other node|every node)\b")
NODES = 2  # the head and one other node
RUN = ("rlbench run --launcher ray --ray-address HEAD_IP:6379 --placement server --transport tcp --steps 600 "
       "--hp learning_starts=200 --actors 1 --no-out")


def recipe() -> list[tuple[str, str]]:
    """(shell line, where: 'the head node', 'every other node' or 'every node'), in README order."""
    found = RECIPE.search((REPO / "README.md").read_text())
    assert found, "README.md has no <!-- ray-recipe --> ... <!-- /ray-recipe --> block"
    lines = []
    for raw in found.group(1).splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = WHERE.search(line)
        assert where, f"README's recipe line does not say where it runs (# on the head node, ...): {line}"
        lines.append((line, where.group(1)))
    return lines


def test_the_readme_recipe_gives_every_node_the_token_before_ray_starts():
    lines = recipe()
    index = {what: next((i for i, (line, _) in enumerate(lines) if what in line), None)
             for what in ("RAY_AUTH_MODE=token", "auth_token", "ray start --head", "ray start --address")}
    assert None not in index.values(), (index, lines)
    assert index["RAY_AUTH_MODE=token"] < index["ray start --head"] < index["ray start --address"]
    assert index["auth_token"] < index["ray start --head"]
    assert dict(lines)[next(line for line, _ in lines if "RAY_AUTH_MODE=token" in line)] == "every node"


class FakeRay:
    """ray.init failing as Ray 2.60's does when the cluster's token authentication turns it away."""

    class AuthenticationError(Exception):
        pass

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def is_initialized(self) -> bool:
        return False

    def init(self, **_):
        raise self.error


def refused_by_ray() -> ConnectionError:
    """What ray.init(address=HOST:PORT) raises when the GCS refuses the token, after its retries."""
    try:
        try:
            raise RuntimeError("Failed to connect to GCS. Last connection error: Traceback ...\nray.exceptions."
                               "AuthenticationError: RPC error: InvalidAuthToken: Authentication token is missing "
                               "or incorrect.")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause
    except ConnectionError as error:
        return error


@pytest.mark.parametrize("env, says", [
    ({}, "RAY_AUTH_MODE is not token here, so no token was sent"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/nonexistent"}, "there is no token at /nonexistent"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "{token}"}, "the token at {token} is not the cluster's"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x"}, "RAY_AUTH_TOKEN is not the cluster's token"),
])
def test_a_driver_turned_away_by_the_clusters_token_is_told_what_to_do(monkeypatch, tmp_path, env, says):
    from rlbench.cluster.ray import connect
    from rlbench.errors import RlbenchError

    token = tmp_path / "auth_token"
    token.write_text("not the cluster's")
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(token=token))
    no_token = FakeRay.AuthenticationError("Token authentication is enabled but no authentication token was found")
    for error in (refused_by_ray(), no_token):
        with pytest.raises(RlbenchError) as info:
            connect(FakeRay(error), "10.0.0.1:6379", 1)
        message = str(info.value)
        assert message.startswith("cannot connect to the Ray cluster at 10.0.0.1:6379: Ray's token authentication "
                                  "refused this process: "), message
        assert says.format(token=token) in message and "export RAY_AUTH_MODE=token" in message, message
    with pytest.raises(RlbenchError, match="Failed to connect to Ray cluster at 10.0.0.1:6379$"):  # no token at stake
        connect(FakeRay(ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")), "10.0.0.1:6379", 1)
    with pytest.raises(KeyError):  # not a connection failure: not turned into one
        connect(FakeRay(KeyError("bug")), "10.0.0.1:6379", 1)

@dataclass
class Host:
    namespace: str
    ip: str
    root: Path
    exports: list[str] = field(default_factory=list)  # the recipe's `export` lines this host ran

    @property
    def home(self) -> Path:
        return self.root / "home"

    def shell(self, line: str, scp: str, timeout: float = 120, extra: dict[str, str] | None = None,
              exports: bool = True) -> subprocess.CompletedProcess:
        env = {"PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(self.home), "RAY_TMPDIR": str(self.root / "tmp"), "LANG": "C.UTF-8",
               "RAY_USAGE_STATS_ENABLED": "0", **(extra or {})}
        script = "\n".join(["set -e -o pipefail", scp, *(self.exports if exports else []), line])
        return subprocess.run(["ip", "netns", "exec", self.namespace, "env", "-i",
                               *(f"{k}={v}" for k, v in env.items()), "bash", "-c", script],
                              capture_output=True, text=True, timeout=timeout, cwd=self.home)


@pytest.fixture
def hosts():
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    tag = secrets.token_hex(2)
    subnet = f"10.78.{secrets.randbelow(200) + 20}"
    letters = [chr(97 + i) for i in range(NODES)]
    net = NamespaceCluster(tag, [f"rlbq{tag}{x}" for x in letters], [f"{subnet}.{i + 1}" for i in range(NODES)],
                           [f"rlbq{tag}{x}h" for x in letters], f"rlbq{tag}br", tempfile.mkdtemp(prefix="rlbq"))
    try:
        _ip("link", "add", net.bridge, "type", "bridge")
        net.created.append("bridge")
        _ip("link", "set", net.bridge, "up")
        made = []
        for name, ip, host_end, letter in zip(net.names, net.ips, net.host_ends, letters):
            _ip("netns", "add", name)
            net.created.append(name)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", host_end, "master", net.bridge, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "route", "add", "default", "dev", "eth0")  # Ray finds its node IP by the route out
            host = Host(name, ip, Path(net.temp_dir) / letter)
            (host.home / ".ray").mkdir(parents=True)
            (host.root / "tmp").mkdir()
            stale = host.home / ".ray" / "auth_token"  # a token of its own, as a Ray started here would leave
            stale.write_text(secrets.token_hex(32))
            stale.chmod(0o600)
            made.append(host)
        yield made
    finally:
        _take_down(net)  # every process in the namespaces killed by pid, namespaces, links, homes deleted


def scp_between(hosts: list[Host]) -> str:
    """`scp HOST:PATH DEST` for this simulation: PATH (relative: under HOST's home) copied to DEST."""
    cases = "\n".join(f"    {h.ip}) home={shlex.quote(str(h.home))};;" for h in hosts)
    return (f'scp() {{\n  local from=$1 to=$2 home path\n  case ${{from%%:*}} in\n{cases}\n'
            f'    *) echo "scp: no host ${{from%%:*}}" >&2; return 1;;\n  esac\n'
            f'  path=${{from#*:}}; [[ $path = /* ]] || path=$home/$path\n  cp "$path" "$to"\n}}')


def test_the_readme_recipe_runs_as_written_on_separate_hosts(hosts):
    head, others = hosts[0], hosts[1:]
    scp = scp_between(hosts)
    on = {"the head node": [head], "every other node": others, "every node": hosts}
    for line, where in recipe():
        command = line.replace("HEAD_IP", head.ip)
        for host in on[where]:
            done = host.shell(command, scp)
            assert done.returncode == 0, f"{command!r} on {host.ip}: {(done.stderr or done.stdout)[-3000:]}"
            if command.startswith("export "):
                host.exports.append(command)
    token = (head.home / ".ray" / "auth_token").read_text()
    assert all((h.home / ".ray" / "auth_token").read_text() == token for h in hosts)
    node = others[0]
    run = RUN.replace("HEAD_IP", head.ip)

    # the old recipe's driver (no RAY_AUTH_MODE) is refused, saying what to do (Ray's GCS retries cut to 2 s)
    refused = node.shell(run, scp, exports=False, extra={"RAY_gcs_server_port_wait_time_s": "2"})
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert ("Ray's token authentication refused this process: RAY_AUTH_MODE is not token here" in refused.stderr
            and "export RAY_AUTH_MODE=token" in refused.stderr), refused.stderr[-3000:]

    done = node.shell(run, scp, timeout=180)
    assert done.returncode == 0, (done.stderr or done.stdout)[-3000:]
    assert re.search(r"^rlbench \S+\s+COMPLETE$", done.stdout, re.M), done.stdout[:2000]
    roles = [row for row in done.stdout.splitlines() if re.match(r"\s+(actor-0|learner|replay)\s", row)]
    assert {ip for ip in (h.ip for h in hosts) if any(ip in row for row in roles)} == {h.ip for h in hosts}, roles
