"""`rlbench dpdk doctor` and `rlbench bench dpdk`. Only click is imported at module level."""

from __future__ import annotations

import json

import click

from rlbench.kit.bench import parse_sizes


@click.group("dpdk")
def dpdk_group() -> None:
    """The DPDK transport plugin: what DPDK sees here."""


@dpdk_group.command("doctor")
@click.option("--eal-args", default="", help="extra EAL arguments to try, quoted")
def doctor(eal_args: str) -> None:
    """DPDK version, EAL args, ports, hugepages, and why something cannot run."""
    from rlbench_dpdk.doctor import report

    for topic, finding in report(eal_args):
        click.echo(f"{topic:<22} {finding}")


@click.command("dpdk")
@click.option("--sizes", default="64,1024,4096,16384,65536", show_default=True, callback=parse_sizes,
              help="payload bytes of INSERT and SAMPLE, comma-separated")
@click.option("--requests", default=2000, show_default=True, type=click.IntRange(min=50),
              help="round trips per transport, operation and size")
@click.option("--transport", "transports", multiple=True, default=("udp", "tcp", "dpdk"), show_default=True,
              help="transports to compare (repeatable)")
@click.option("--dpdk-port", default="memif", show_default=True, help="the DPDK port (memif, af_packet:IFACE ...)")
@click.option("--placement-seconds", default=4.0, show_default=True, type=click.FloatRange(min=0.5),
              help="learner sampling time per placement (0 placement comparison: --no-placement)")
@click.option("--no-placement", is_flag=True, help="skip the server vs in-network comparison")
@click.option("--mtus", default="1500,9000", show_default=True, callback=parse_sizes,
              help="memif MTUs to compare (echo round trips and throughput of --mtu-sizes messages)")
@click.option("--mtu-sizes", default="4096,16384,65536", show_default=True, callback=parse_sizes,
              help="message bytes of the MTU comparison")
@click.option("--no-mtu", is_flag=True, help="skip the memif MTU comparison")
@click.option("--veth", is_flag=True, help="also: af_packet and af_xdp vs kernel UDP over a veth pair "
              "between two network namespaces (root)")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
def bench_command(sizes: tuple[int, ...], requests: int, transports: tuple[str, ...], dpdk_port: str,
                  placement_seconds: float, no_placement: bool, mtus: tuple[int, ...], mtu_sizes: tuple[int, ...],
                  no_mtu: bool, veth: bool, as_json: bool) -> None:
    """The DPDK paper's table: replay access latency over kernel UDP/TCP vs DPDK, and prioritized
    sampling under server vs in-network placement, with reductions next to the paper's ranges; then
    what memif's MTU changes for 4..64 KB messages."""
    from rlbench.errors import RlbenchError
    from rlbench_dpdk.bench import format_table, run_mtu_comparison, run_reproduction
    from rlbench_dpdk.transport import DpdkTransport

    try:
        for mtu in () if no_mtu else mtus:
            DpdkTransport(mtu=mtu)  # refuses an MTU out of range before anything runs
        results = run_reproduction(list(transports), sizes, requests, dpdk_port,
                                   None if no_placement else placement_seconds)
        if not no_mtu:
            results["mtu"] = run_mtu_comparison(mtus, mtu_sizes, min(requests, 1000))
        if veth:
            from rlbench_dpdk.bench import run_veth

            results["veth"] = run_veth(sizes, requests)
    except RlbenchError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(json.dumps(results, indent=2) if as_json else format_table(results))
