"""rlbench hooks of the dpdk plugin. Cheap to import: no cffi module, no EAL (they load on first use)."""

from __future__ import annotations

from typing import Any

from rlbench.hookspecs import hookimpl
from rlbench_dpdk.capabilities import CAPABILITIES, DEFAULT_MTU, MEMIF_MTU_RANGE

RLBENCH_API = "1.1"  # the plugin API this plugin targets (docs/plugin-api-changelog.md)


@hookimpl
def rlbench_register_transports(register: Any) -> None:
    register("dpdk", "rlbench_dpdk.transport:DpdkTransport", probe="rlbench_dpdk.native:probe",
             capabilities=CAPABILITIES,
             description="DPDK kernel bypass (memif between processes; af_packet/af_xdp/NIC ports), "
                         "Ethernet/IPv4/UDP frames, go-back-N retransmission")


@hookimpl
def rlbench_register_run_options(option: Any) -> None:
    option("transport", "dpdk", "--dpdk-port", "port", default="memif",
           help="DPDK port: memif | af_packet:IFACE | af_xdp:IFACE | PCI address")
    option("transport", "dpdk", "--dpdk-eal-args", "eal_args", default="",
           help="extra DPDK EAL arguments, quoted (they win over rlbench's defaults)")
    option("transport", "dpdk", "--dpdk-mtu", "mtu", type=int, default=DEFAULT_MTU,
           help=f"largest IP packet on memif ports ({MEMIF_MTU_RANGE[0]}..{MEMIF_MTU_RANGE[1]}); "
                "wire ports keep their interface's MTU")


@hookimpl
def rlbench_register_commands(cli: Any) -> None:
    from rlbench_dpdk.cli import bench_command, dpdk_group

    cli.add_command(dpdk_group)
    bench = cli.commands.get("bench")
    if bench is not None:
        bench.add_command(bench_command)


@hookimpl
def rlbench_fingerprint() -> dict[str, Any] | None:
    from rlbench_dpdk.doctor import fingerprint

    return fingerprint()
