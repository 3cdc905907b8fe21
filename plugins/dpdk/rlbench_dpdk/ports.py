"""Which DPDK port a transport uses: `memif` (between processes of one host, the default),
`af_packet:IFACE`, `af_xdp:IFACE`, or a NIC's PCI address (bound to a DPDK-capable driver)."""

from __future__ import annotations

import difflib
import itertools
import os
from dataclasses import dataclass

from rlbench.errors import RlbenchError
from rlbench_dpdk.capabilities import FRAME_ROOM_BYTES
from rlbench_dpdk.native import PCI_ADDRESS

KINDS = ("memif", "af_packet", "af_xdp")
_names = itertools.count()


class PortSpecError(RlbenchError, ValueError):
    pass


@dataclass(frozen=True)
class PortSpec:
    kind: str  # "memif", "af_packet", "af_xdp" or "pci"
    target: str = ""  # interface name, or PCI address

    @classmethod
    def parse(cls, text: str) -> "PortSpec":
        text = (text or "memif").strip()
        if PCI_ADDRESS.match(text):
            return cls("pci", text if text.count(":") == 2 else "0000:" + text)
        kind, _, target = text.partition(":")
        if kind not in KINDS:
            close = difflib.get_close_matches(kind, KINDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PortSpecError(f"unknown DPDK port {text!r}; {hint}use memif, af_packet:IFACE, af_xdp:IFACE "
                                "or a PCI address like 0000:01:00.0")
        if kind == "memif" and target:
            raise PortSpecError(f"memif takes no interface, got {text!r}")
        if kind != "memif" and not target:
            raise PortSpecError(f"{kind} needs an interface: --dpdk-port {kind}:IFACE (e.g. {kind}:veth0)")
        if kind != "memif" and not os.path.exists(f"/sys/class/net/{target}"):
            raise PortSpecError(f"{kind}: no network interface {target!r} in this network namespace")
        return cls(kind, target)

    def __str__(self) -> str:
        return self.kind if self.kind == "memif" else self.target if self.kind == "pci" else f"{self.kind}:{self.target}"

    @property
    def on_wire(self) -> bool:
        """A port every endpoint opens on its own interface (not memif's socket rendezvous)."""
        return self.kind != "memif"

    def devargs(self) -> str:
        """Device arguments for a new port of this kind, with a name unique in this process."""
        unique = f"{os.getpid()}_{next(_names)}"
        if self.kind == "af_packet":  # its ring frames must hold the interface's largest frame
            frame = max(2048, -(-(_interface_mtu(self.target) + 64) // 16) * 16)
            block = -(-frame // 4096) * 4096
            return f"net_af_packet_{unique},iface={self.target},qpairs=1,framesz={frame},blocksz={block}"
        if self.kind == "af_xdp":
            return f"net_af_xdp_{unique},iface={self.target},start_queue=0,queue_count=1"
        if self.kind == "pci":
            return self.target
        raise PortSpecError("memif ports are opened with memif_devargs()")


def _interface_mtu(iface: str) -> int:
    try:
        with open(f"/sys/class/net/{iface}/mtu") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1500


def memif_devargs(role: str, interface_id: int, socket_name: str) -> str:
    """A memif interface on an abstract Unix socket (nothing left on disk, even after a crash).

    Every ring buffer holds the largest frame the shim builds (bsize): in DPDK 22.11 the memif PMD's
    copying transmit never clears the chain flag of a packet's first descriptor, so once a frame has
    spanned several descriptors, a later one-descriptor frame in that slot reads as chained and the
    receiver runs past what was published (truncated and merged frames, seen with 9000-byte frames in
    2048-byte buffers). 512 descriptors (rsize) hold four windows of frames: 9.4 MB shared per interface."""
    unique = f"{os.getpid()}_{next(_names)}"
    return (f"net_memif_{unique},role={role},id={interface_id},socket=/rlbench-dpdk/{socket_name}.sock,"
            f"socket-abstract=yes,bsize={FRAME_ROOM_BYTES},rsize=9")
