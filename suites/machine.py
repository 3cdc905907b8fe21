"""Record rlbench's hardware fingerprint in asv's entry for this machine (~/.asv-machine.json).

asv copies that entry into results/<machine>/machine.json and into the params of every result it saves,
and the dashboard offers each field as a filter, so every figure carries the hardware it came from
(DPDK version and ports, OpenCL device, DPU count, GPU) beside asv's machine name. Run it after
`asv machine --yes`, before `asv run`:

    python -m suites.machine [--machine NAME]

Not a benchmark module: asv imports it and finds nothing to run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from typing import Any

MAX_FIELD = 200  # characters; the dashboard shows each field in a filter list


def _short(text: str) -> str:
    return text if len(text) <= MAX_FIELD else text[:MAX_FIELD - 3] + "..."


def _scalars(data: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in data.items() if isinstance(v, (str, int, float, bool)) and v not in ("", None))


def summarise_dpdk(data: dict[str, Any]) -> str:
    if data.get("unavailable_reason"):
        return f"unavailable: {data['unavailable_reason']}"
    ports = data.get("ports") or {}
    interfaces = ports.get("af_packet/af_xdp interfaces") or []
    pci = ports.get("pci_bound_to_dpdk_drivers") or []
    return (f"DPDK {data.get('dpdk_version')}; ports: memif; af_packet/af_xdp {','.join(interfaces) or 'none'}; "
            f"PCI {','.join(pci) or 'none'}; hugepages free {data.get('hugepages_free_mib')} MiB")


def summarise_fpga(data: dict[str, Any]) -> str:
    if "device" not in data:
        return _scalars(data)
    kind = data.get("emulation_kind") if data.get("emulation") else "hardware"
    return f"{data.get('platform')}: {data['device']} ({data.get('type')}; {kind})"


def summarise_upmem(data: dict[str, Any]) -> str:
    return f"{data.get('hardware_dpus', 0)} hardware DPUs; mode {data.get('mode')}; SDK {data.get('sdk') or 'none'}"


def summarise_gpu(data: dict[str, Any]) -> str:
    if data.get("available") is False:
        return f"none: {data.get('reason', '')}"
    return _scalars(data)


SUMMARIES = {"dpdk": summarise_dpdk, "fpga": summarise_fpga, "upmem": summarise_upmem, "gpu": summarise_gpu}


def machine_fields(fingerprint: dict[str, Any]) -> dict[str, str]:
    """One short string per plugin (field rlbench_<plugin>), plus the core's versions."""
    packages = fingerprint.get("packages") or {}
    fields = {"rlbench_versions": ", ".join(f"{k} {v}" for k, v in packages.items() if v),
              "rlbench_cores_usable": str(fingerprint.get("cores_usable"))}
    for plugin, data in sorted((fingerprint.get("plugins") or {}).items()):
        summary = SUMMARIES.get(plugin, _scalars)
        try:
            fields[f"rlbench_{plugin}"] = _short(summary(data) if isinstance(data, dict) else str(data))
        except Exception as error:  # a plugin's odd fingerprint must not stop the benchmark run
            fields[f"rlbench_{plugin}"] = f"unreadable fingerprint: {type(error).__name__}: {error}"
    if "gpu" not in fingerprint.get("plugins", {}):
        fields["rlbench_gpu"] = "none: plugin rlbench-gpu not installed"
    return fields


def update_machine_file(path: str, machine: str | None, fields: dict[str, str]) -> str:
    """Add `fields` to the machine's entry; returns the machine name. The entry must exist."""
    if not os.path.isfile(path):
        raise SystemExit(f"{path} not found: run `asv machine --yes` first")
    with open(path) as stream:
        entries = json.load(stream)
    names = [name for name in entries if name != "version"]
    if machine is None:
        machine = platform.node() if platform.node() in names else (names[0] if len(names) == 1 else None)
    if machine not in entries:
        raise SystemExit(f"no asv machine entry {machine!r} in {path} (known: {', '.join(names) or 'none'}): "
                         "run `asv machine --yes --machine NAME` first")
    entries[machine].update(fields)
    with open(path, "w") as stream:
        json.dump(entries, stream, indent=4, sort_keys=True)
    return machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", help="asv machine name (default: this host's, or the only entry)")
    parser.add_argument("--machine-file", default=os.path.expanduser("~/.asv-machine.json"))
    args = parser.parse_args()
    from rlbench.fingerprint import machine_fingerprint

    fields = machine_fields(machine_fingerprint())
    name = update_machine_file(args.machine_file, args.machine, fields)
    for key, value in fields.items():
        print(f"{name}: {key} = {value}")


if __name__ == "__main__":
    main()
