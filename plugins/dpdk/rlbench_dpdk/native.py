"""The compiled shim, the EAL (once per process) and the probe that says why DPDK cannot run here.

Importing this module is cheap; the cffi extension loads on the first `library()` call.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import threading
from typing import Any

from rlbench.errors import RlbenchError
from rlbench.protocols import Probe

# The shim's counters, in the order of rlb_dpdk.h. The last four, and malformed, count peers that
# break the rules: refused_oversize (a message over this side's max_message_bytes, refused before
# anything was allocated for it), malformed (frames that do not parse or break the protocol),
# dropped_peers (peers ended for any of these, or for going quiet mid-message, or for never saying
# hello on the memif interface they asked for), refused_peers (hellos a full listener turned away),
# slow_consumers (peers whose send queue would have passed max_queued_bytes).
STAT_NAMES = ("messages_sent", "messages_received", "bytes_sent", "bytes_received", "lost", "frames_sent",
              "frames_received", "retransmits", "acks_sent", "gap_reports", "duplicates", "out_of_order",
              "malformed", "tx_full_waits", "refused_oversize", "dropped_peers", "refused_peers", "slow_consumers")
INSTALL_HINT = "apt-get install dpdk libdpdk-dev pkg-config, then reinstall: pip install -e plugins/dpdk"
_MIN_HUGEPAGE_BYTES = 256 << 20

_lock = threading.Lock()
_eal_args: list[str] | None = None  # what this process initialised the EAL with


class DpdkError(RlbenchError):
    """DPDK refused something (EAL, a port, a link); the message says what and why."""


def libdpdk_version() -> str | None:
    """libdpdk's version per pkg-config, or None where pkg-config or libdpdk-dev is missing."""
    if shutil.which("pkg-config") is None:
        return None
    done = subprocess.run(["pkg-config", "--modversion", "libdpdk"], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def probe() -> Probe:
    """Cheap: finds the compiled shim without loading it."""
    if importlib.util.find_spec("rlbench_dpdk._native") is not None:
        return Probe.ok()
    if libdpdk_version() is None:
        return Probe.missing(f"libdpdk not found: {INSTALL_HINT}")
    return Probe.missing("rlbench-dpdk was installed before libdpdk was; rebuild its shim: pip install -e plugins/dpdk")


def library() -> tuple[Any, Any]:
    """(ffi, lib) of the compiled shim."""
    try:
        from rlbench_dpdk._native import ffi, lib
    except ImportError as exc:
        raise DpdkError(f"the DPDK shim is not built ({exc}); {probe().reason or INSTALL_HINT}") from None
    if lib.RLB_STATS_N != len(STAT_NAMES):
        raise DpdkError(f"the DPDK shim counts {lib.RLB_STATS_N} statistics, this package names {len(STAT_NAMES)}; "
                        "rebuild it: pip install -e plugins/dpdk")
    return ffi, lib


def hugepages_free_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        return int(info["HugePages_Free"].split()[0]) * int(info["Hugepagesize"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0


def _cpu_list() -> str:
    """The CPUs this process may use, as an EAL list: '0-1' or '0,2,5'."""
    cpus = sorted(os.sched_getaffinity(0))
    ranges, start = [], cpus[0]
    for previous, current in zip(cpus, cpus[1:] + [None]):
        if current != previous + 1:
            ranges.append(f"{start}-{previous}" if previous != start else str(start))
            start = current
    return ",".join(ranges)


def default_eal_args(user_args: str = "", pci: str | None = None) -> list[str]:
    """EAL arguments that work here without root or hugepages, then the user's (which win).

    `--lcores=0@(CPUS)` makes the calling thread lcore 0 without pinning it to one CPU: a plain
    `-l 1` would pin the Python process, and every thread it starts later, to that core."""
    user = shlex.split(user_args or "")
    args = [f"--lcores=0@({_cpu_list()})", "--no-telemetry", "--log-level=*:error"]
    if hugepages_free_bytes() >= _MIN_HUGEPAGE_BYTES:
        args.append("--in-memory")  # no shared files; clashes with --no-huge, so only with hugepages
    else:
        args += ["--no-huge", "--no-shconf", "-m", "128"]
    if pci:
        args += ["-a", pci]
    elif not any(a in ("-a", "--allow", "-b", "--block") or a.startswith(("--allow=", "-a")) for a in user):
        args.append("--no-pci")
    taken = {a.split("=", 1)[0] for a in user if a.startswith("-")}
    if taken & {"-l", "--lcores", "-c"}:
        args = [a for a in args if not a.startswith("--lcores")]
    if "-m" in taken or "--socket-mem" in taken:
        args = [a for a in args if a not in ("-m", "128")]
    return args + user


def ensure_eal(user_args: str = "", pci: str | None = None) -> Any:
    """Initialise the EAL in this process (the first call wins; later calls must agree); returns lib.

    The EAL cannot be initialised twice nor survive a fork: roles are spawned, never forked."""
    global _eal_args
    ffi, lib = library()
    args = default_eal_args(user_args, pci)
    with _lock:
        if _eal_args is None:
            rc = lib.rlb_init(" ".join(args).encode())
            if rc < 0:
                raise DpdkError(f"DPDK EAL did not start ({error_text(ffi, lib)}); EAL args: {' '.join(args)}")
            _eal_args = args
        elif args != _eal_args and (user_args or pci):
            raise DpdkError(f"the DPDK EAL of this process already runs with {' '.join(_eal_args)}; "
                            f"it cannot restart with {' '.join(args)} (one EAL per process)")
    return lib


def eal_args_in_use() -> list[str] | None:
    return None if _eal_args is None else list(_eal_args)


def error_text(ffi: Any, lib: Any) -> str:
    return ffi.string(lib.rlb_last_error()).decode(errors="replace") or "no detail"


PCI_ADDRESS = re.compile(r"^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
