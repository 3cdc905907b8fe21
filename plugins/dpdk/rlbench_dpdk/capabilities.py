"""What the dpdk transport declares about itself, once: plugin.py registers these objects and the
transport refers to the same ones. A leaf: it imports nothing of the plugin, and no cffi or DPDK."""

from __future__ import annotations

from rlbench.protocols import TransportCapabilities

_MiB = 1 << 20
CAPABILITIES = TransportCapabilities(max_message_bytes=64 * _MiB, reliable=True, ordered=True,
                                     crosses_processes=True, crosses_hosts=True)

# The largest frame the shim builds: one mbuf of its pool (MBUF_ROOM in csrc/rlb_dpdk.c).
FRAME_ROOM_BYTES = 9216
# memif's PMD has no MTU of its own (rte_eth_dev_set_mtu answers ENOTSUP in DPDK 22.11): the shim
# picks the frame size on memif ports, up to FRAME_ROOM_BYTES less the 14-byte Ethernet header. Wire
# ports keep their interface's MTU.
MEMIF_MTU_RANGE = (576, FRAME_ROOM_BYTES - 14)
DEFAULT_MTU = 9000
