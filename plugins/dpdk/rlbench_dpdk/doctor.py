"""What DPDK sees on this machine: `rlbench dpdk doctor` and the plugin's fingerprint."""

from __future__ import annotations

import os
from typing import Any

from rlbench_dpdk import native
from rlbench_dpdk.capabilities import DEFAULT_MTU, FRAME_ROOM_BYTES, MEMIF_MTU_RANGE

_DPDK_DRIVERS = ("vfio-pci", "uio_pci_generic", "igb_uio")


def _interfaces() -> list[str]:
    try:
        return sorted(name for name in os.listdir("/sys/class/net") if name != "lo")
    except OSError:
        return []


def _dpdk_bound_pci() -> list[str]:
    """PCI devices bound to a driver DPDK can use (what `-a ADDRESS` could open)."""
    found = []
    for driver in _DPDK_DRIVERS:
        path = f"/sys/bus/pci/drivers/{driver}"
        if os.path.isdir(path):
            found += [f"{name} ({driver})" for name in os.listdir(path) if name.count(":") == 2]
    return sorted(found)


def _is_root() -> bool:
    return os.geteuid() == 0


def fingerprint() -> dict[str, Any]:
    """Cheap facts (no EAL start): versions, hugepages, candidate ports."""
    probe = native.probe()
    return {
        "dpdk_version": native.libdpdk_version(),
        "shim_built": probe.available,
        "unavailable_reason": probe.reason if not probe.available else None,
        "hugepages_free_mib": native.hugepages_free_bytes() >> 20,
        "default_eal_args": native.default_eal_args(),
        "eal_args_in_use": native.eal_args_in_use(),
        "ports": {"memif": "between processes of this host",
                  "af_packet/af_xdp interfaces": _interfaces(),
                  "pci_bound_to_dpdk_drivers": _dpdk_bound_pci()},
        "root": _is_root(),
    }


PROBE_MESSAGE_BYTES = 65536


def _memif_loopback(eal_args: str, mtu: int = DEFAULT_MTU) -> dict[str, Any]:
    """Start the EAL here, pass a 64 KiB message through a memif listener and a client, and count the
    frames it took (the shim's own counters)."""
    from rlbench_dpdk.transport import DpdkTransport

    transport = DpdkTransport("memif", eal_args, mtu=mtu)
    listener = transport.listen()
    try:
        connection = transport.connect(listener.address, timeout=5.0)
        try:
            message = bytes(range(256)) * (PROBE_MESSAGE_BYTES // 256)
            before = connection.stats["frames_sent"]
            connection.send(message)
            got = listener.recv(timeout=5.0)
            frames = connection.stats["frames_sent"] - before
            ok = got is not None and bytes(got[1]) == message
            info = port_info(connection._port)
        finally:
            connection.close()
    finally:
        listener.close()
    return {"message_through_memif": ok, **info, "probe_message_bytes": PROBE_MESSAGE_BYTES,
            "probe_frames": frames, "bytes_per_frame": round(PROBE_MESSAGE_BYTES / frames) if frames else 0}


def port_info(port: int) -> dict[str, Any]:
    ffi, lib = native.library()
    driver = ffi.new("char[]", 64)
    mtu, payload, up, device_mtu = ffi.new("uint32_t *"), ffi.new("uint32_t *"), ffi.new("int *"), ffi.new("uint32_t *")
    if lib.rlb_port_info(port, driver, 64, mtu, payload, up, device_mtu) < 0:
        return {}
    return {"driver": ffi.string(driver).decode(), "mtu": int(mtu[0]), "frame_payload_bytes": int(payload[0]),
            "device_mtu": int(device_mtu[0]), "link_up": bool(up[0])}


def _mtu_finding(result: dict[str, Any]) -> str:
    """What MTU memif runs with, measured: the frames a 64 KiB message took."""
    mtu, device_mtu = result["mtu"], result["device_mtu"]
    asked = "as configured" if mtu == DEFAULT_MTU else f"not the {DEFAULT_MTU} configured"
    return (f"{mtu} ({asked}): frames of up to {mtu + 14} B, {result['frame_payload_bytes']} B of message each; "
            f"measured: a {result['probe_message_bytes']} B message took {result['probe_frames']} frames "
            f"({result['bytes_per_frame']} B per frame). DPDK reports MTU {device_mtu} for the port: the memif PMD "
            f"has no MTU of its own (rte_eth_dev_set_mtu: not supported) and carries any frame its ring buffers "
            f"hold; rlbench sizes them to one frame (bsize {FRAME_ROOM_BYTES}), so the MTU is rlbench's to choose, "
            f"{MEMIF_MTU_RANGE[0]}..{MEMIF_MTU_RANGE[1]} (--dpdk-mtu). af_packet/af_xdp/NIC ports keep their "
            "interface's MTU")


def report(eal_args: str = "") -> list[tuple[str, str]]:
    """(topic, finding) lines; every 'no' says what to do."""
    lines: list[tuple[str, str]] = []
    version = native.libdpdk_version()
    lines.append(("libdpdk (pkg-config)", version or f"not found: {native.INSTALL_HINT}"))
    probe = native.probe()
    lines.append(("shim", "built" if probe.available else f"not built: {probe.reason}"))
    hugepages = native.hugepages_free_bytes() >> 20
    lines.append(("hugepages free", f"{hugepages} MiB" + ("" if hugepages else
                  " (none: EAL runs with --no-huge; memif, af_packet and af_xdp work without them)")))
    lines.append(("EAL args", " ".join(native.default_eal_args(eal_args))))
    if probe.available:
        try:
            result = _memif_loopback(eal_args)
            ok = result["message_through_memif"]
            lines.append(("memif", f"{'works' if ok else 'FAILED'}: a {result['probe_message_bytes']} B message "
                          f"{'arrived whole' if ok else 'did not arrive whole'} (driver {result.get('driver')}, link up "
                          f"{result.get('link_up')})"))
            lines.append(("memif MTU", _mtu_finding(result)))
        except Exception as exc:  # the doctor reports every failure instead of stopping
            lines.append(("memif", f"FAILED: {type(exc).__name__}: {exc}"))
    interfaces = _interfaces()
    raw = "yes (root)" if _is_root() else "needs CAP_NET_RAW + CAP_NET_ADMIN (root)"
    lines.append(("af_packet", f"interfaces {', '.join(interfaces) or 'none'}; {raw}"))
    lines.append(("af_xdp", f"interfaces {', '.join(interfaces) or 'none'}; "
                  + ("root: yes" if _is_root() else "needs root") + "; one DPDK port per interface queue and process"))
    pci = _dpdk_bound_pci()
    lines.append(("NIC (PCI)", ", ".join(pci) if pci else
                  "none bound to vfio-pci/uio_pci_generic (dpdk-devbind.py --bind=vfio-pci ADDRESS)"))
    lines.append(("rx interrupts", "not on memif/af_packet/af_xdp: pollers spin, then yield, then sleep"))
    return lines
