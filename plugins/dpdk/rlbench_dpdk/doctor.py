"""What DPDK sees on this machine: `rlbench dpdk doctor` and the plugin's fingerprint."""

from __future__ import annotations

import os
from typing import Any

from rlbench_dpdk import native

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


def _memif_loopback(eal_args: str) -> dict[str, Any]:
    """Start the EAL here and pass one message through a memif listener and a client."""
    from rlbench_dpdk.transport import DpdkTransport

    transport = DpdkTransport("memif", eal_args)
    listener = transport.listen()
    try:
        connection = transport.connect(listener.address, timeout=5.0)
        try:
            connection.send(b"doctor")
            got = listener.recv(timeout=5.0)
            ok = got is not None and bytes(got[1]) == b"doctor"
            info = port_info(connection._port)
        finally:
            connection.close()
    finally:
        listener.close()
    return {"message_through_memif": ok, **info}


def port_info(port: int) -> dict[str, Any]:
    ffi, lib = native.library()
    driver = ffi.new("char[]", 64)
    mtu, payload, up = ffi.new("uint32_t *"), ffi.new("uint32_t *"), ffi.new("int *")
    if lib.rlb_port_info(port, driver, 64, mtu, payload, up) < 0:
        return {}
    return {"driver": ffi.string(driver).decode(), "mtu": int(mtu[0]), "frame_payload_bytes": int(payload[0]),
            "link_up": bool(up[0])}


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
            lines.append(("memif", f"works: {result}"))
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
