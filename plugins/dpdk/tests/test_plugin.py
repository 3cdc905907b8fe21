"""Registration, options, bad input, the doctor and the plugin's import cost."""

import subprocess
import sys

import pytest

import rlbench
from rlbench.errors import RlbenchError
from rlbench_dpdk import native
from rlbench_dpdk.ports import PortSpec
from rlbench_dpdk.transport import DpdkTransport


def test_registered_with_run_options():
    registry = rlbench.get_registry()
    component = registry.get("transport", "dpdk")
    assert component.plugin == "dpdk" and component.capabilities.reliable
    flags = {option.flag: option.param for option in registry.options_for("transport", "dpdk")}
    assert flags == {"--dpdk-port": "port", "--dpdk-eal-args": "eal_args", "--dpdk-mtu": "mtu"}


def test_importing_the_plugin_loads_neither_cffi_nor_dpdk():
    code = ("import sys, rlbench_dpdk.plugin, rlbench; rlbench.get_registry(); "
            "print(sorted(m for m in sys.modules if m.startswith(('_cffi', 'cffi', 'rlbench_dpdk._native'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("text, expected", [
    ("memfi", "did you mean 'memif'"),
    ("af_packet", "needs an interface"),
    ("af_xdp:no-such-if0", "no network interface"),
    ("memif:x", "takes no interface"),
])
def test_bad_ports_are_refused_clearly(text, expected):
    with pytest.raises(RlbenchError, match=expected):
        PortSpec.parse(text)


def test_port_specs():
    assert PortSpec.parse("") == PortSpec("memif")
    assert PortSpec.parse("01:00.0") == PortSpec("pci", "0000:01:00.0")
    assert PortSpec.parse("af_packet:lo").devargs().startswith("net_af_packet_")


@pytest.mark.parametrize("address", ["udp://1.2.3.4:5", "dpdk://memif/", "dpdk://wire/xyz", "dpdk://ring/a"])
def test_bad_addresses_are_refused_clearly(address):
    with pytest.raises(RlbenchError, match="dpdk"):
        DpdkTransport().connect(address, timeout=1.0)


def test_default_eal_args_do_not_pin_python_and_pass_user_args_through():
    args = native.default_eal_args("--log-level=*:debug -a 0000:01:00.0")
    assert any(a.startswith("--lcores=0@(") for a in args) and "-l" not in args
    assert "--no-pci" not in args and args[-2:] == ["-a", "0000:01:00.0"]
    if native.hugepages_free_bytes() < (256 << 20):
        assert "--no-huge" in args and "--in-memory" not in args


def test_probe_says_what_to_install_when_the_shim_is_missing(monkeypatch):
    monkeypatch.setattr(native.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(native, "libdpdk_version", lambda: None)
    reason = native.probe().reason
    assert "libdpdk not found" in reason and "apt-get install dpdk libdpdk-dev pkg-config" in reason


def test_doctor_reports_memif_working_and_the_mtu_it_measured(dpdk_available):
    done = subprocess.run([sys.executable, "-m", "rlbench", "dpdk", "doctor"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {line[:22].strip(): line[22:].strip() for line in done.stdout.splitlines()}
    assert lines["memif"].startswith("works: a 65536 B message arrived whole"), lines["memif"]
    # 9000-byte MTU: 8940 B of message per frame, so 64 KiB in 8 frames (46 at MTU 1500)
    assert lines["memif MTU"].startswith("9000 (as configured)") and "took 8 frames (8192 B per frame)" in lines["memif MTU"]


def test_fingerprint_is_cheap_and_describes_dpdk():
    from rlbench_dpdk.doctor import fingerprint

    facts = fingerprint()
    assert facts["dpdk_version"] == native.libdpdk_version()
    assert "hugepages_free_mib" in facts and "default_eal_args" in facts
