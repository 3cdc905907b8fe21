"""Helpers the plugin's tests run in spawned processes (they must be importable by module name)."""

from __future__ import annotations

from typing import Any

from rlbench_dpdk.transport import DpdkTransport


def echo_node(addresses: Any, results: Any, peers: int, port: str = "memif") -> None:
    """A listener in its own process: echo (prefixed b"echo:") until `peers` peers said b"bye", then
    close in order and report the listener's counters."""
    listener = DpdkTransport(port).listen()
    addresses.put(listener.address)
    served = 0
    try:
        while served < peers:
            got = listener.recv(timeout=20.0)
            if got is None:
                results.put("timed out")
                return
            peer, message = got
            if bytes(message) == b"bye":
                served += 1
            else:
                listener.send(peer, b"echo:", message)
        results.put(listener.stats)
    finally:
        listener.close()
