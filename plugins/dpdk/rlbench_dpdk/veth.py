"""A veth pair between two network namespaces, and echo / ping programs to run inside them.

This is the single-machine stand-in for the paper's NIC path: DPDK's af_packet or af_xdp port on
one end of a veth, the replay side on the other, compared with kernel UDP over the same veth.
Needs root (namespaces, raw sockets). Names start with "rlb" and everything is removed on exit.

    python -m rlbench_dpdk.veth serve --transport dpdk --port af_packet:IFACE      (prints the address)
    python -m rlbench_dpdk.veth ping ADDRESS --transport dpdk --port af_packet:IFACE --sizes 64,4096
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from rlbench.errors import RlbenchError

SERVER_IP, CLIENT_IP = "10.199.0.1", "10.199.0.2"


@dataclass(frozen=True)
class VethPair:
    server_ns: str
    client_ns: str
    server_if: str
    client_if: str

    def run(self, side: str, args: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start `python -m rlbench_dpdk.veth ARGS` inside one side's namespace."""
        ns = self.server_ns if side == "server" else self.client_ns
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "rlbench_dpdk.veth", *args],
                                **kwargs)


def veth_unavailable() -> str | None:
    """Why a veth pair cannot be made here, or None."""
    if os.geteuid() != 0:
        return "veth pairs in network namespaces need root (and CAP_NET_RAW for af_packet)"
    try:
        subprocess.run(["ip", "-V"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "the `ip` command (iproute2) is missing: apt-get install iproute2"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RlbenchError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


@contextmanager
def veth_pair(mtu: int = 1500) -> Iterator[VethPair]:
    """Two namespaces joined by a veth pair with IPv4 addresses; removed afterwards, whatever happens."""
    reason = veth_unavailable()
    if reason:
        raise RlbenchError(reason)
    tag = secrets.token_hex(3)
    pair = VethPair(f"rlbS{tag}", f"rlbC{tag}", f"rlbs{tag}", f"rlbc{tag}")
    try:
        _ip("netns", "add", pair.server_ns)
        _ip("netns", "add", pair.client_ns)
        _ip("link", "add", pair.server_if, "netns", pair.server_ns, "mtu", str(mtu), "type", "veth",
            "peer", "name", pair.client_if, "netns", pair.client_ns, "mtu", str(mtu))
        for ns, iface, ip in ((pair.server_ns, pair.server_if, SERVER_IP), (pair.client_ns, pair.client_if, CLIENT_IP)):
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", iface)
            _ip("-n", ns, "link", "set", iface, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in (pair.server_ns, pair.client_ns):  # deleting a namespace deletes its veth end
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# ---------------------------------------------------------------------------------- the programs
def _transport(name: str, port: str | None) -> Any:
    import rlbench

    options = {"port": port} if name == "dpdk" and port else {}
    return rlbench.get_registry().get("transport", name).create(**options)


def serve(name: str, port: str | None, listen: str | None) -> None:
    """Echo every message until one that starts with b"q"; the first output line is the address."""
    listener = _transport(name, port).listen(listen)
    print(listener.address, flush=True)
    try:
        while True:
            got = listener.recv(timeout=60.0)
            if got is None or bytes(got[1][:1]) == b"q":
                return
            listener.send(got[0], got[1])
    finally:
        listener.close()


def ping(name: str, port: str | None, address: str, sizes: list[int], requests: int) -> dict[str, Any]:
    """Round trips per size, verified; p50/p99 in microseconds."""
    import numpy as np

    connection = _transport(name, port).connect(address, timeout=10.0)
    results: dict[str, Any] = {"transport": name, "port": port, "cases": []}
    try:
        for size in sizes:
            message = b"e" + np.random.default_rng(size).bytes(size - 1)
            for _ in range(min(200, requests)):
                connection.request(message, timeout=10.0)
            samples = np.empty(requests, dtype=np.int64)
            clock = time.perf_counter_ns
            for i in range(requests):
                started = clock()
                reply = connection.request(message, timeout=10.0)
                samples[i] = clock() - started
            if bytes(reply) != message:
                raise RlbenchError(f"{name}: the echo of {size} B came back different")
            results["cases"].append({"size": size, "p50_us": float(np.percentile(samples, 50)) / 1e3,
                                     "p99_us": float(np.percentile(samples, 99)) / 1e3})
        results["stats"] = dict(connection.stats)
        connection.send(b"q")
    finally:
        connection.close()
    return results


def measure_over_veth(pair: VethPair, name: str, port_kind: str | None, sizes: list[int], requests: int,
                      timeout: float = 120.0) -> dict[str, Any]:
    """Echo server on the server side, ping from the client side; returns ping's results."""
    server_args = ["serve", "--transport", name]
    client_args = ["ping", "--transport", name, "--sizes", ",".join(map(str, sizes)), "--requests", str(requests)]
    if port_kind:
        server_args += ["--port", f"{port_kind}:{pair.server_if}"]
        client_args += ["--port", f"{port_kind}:{pair.client_if}"]
    else:
        server_args += ["--listen", f"{name}://{SERVER_IP}:0"]
    server = pair.run("server", server_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline().strip()
        if not address:
            raise RlbenchError(f"{name} echo server in {pair.server_ns} did not start: {server.stderr.read()[-2000:]}")
        client = pair.run("client", client_args + ["--address", address], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        out, err = client.communicate(timeout=timeout)
        if client.returncode != 0:
            raise RlbenchError(f"{name} ping in {pair.client_ns} failed: {err.strip()[-2000:]}")
        server.wait(timeout=10)
        return json.loads(out.strip().splitlines()[-1])
    finally:
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(5)
            except subprocess.TimeoutExpired:
                server.kill()
        for stream in (server.stdout, server.stderr):
            stream.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlbench_dpdk.veth")
    parser.add_argument("mode", choices=("serve", "ping"))
    parser.add_argument("--transport", default="dpdk")
    parser.add_argument("--port")
    parser.add_argument("--listen")
    parser.add_argument("--address")
    parser.add_argument("--sizes", default="64,4096")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        serve(args.transport, args.port, args.listen)
    else:
        sizes = [int(s) for s in args.sizes.split(",")]
        print(json.dumps(ping(args.transport, args.port, args.address, sizes, args.requests)), flush=True)


if __name__ == "__main__":
    main()
