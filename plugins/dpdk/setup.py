"""Builds the C shim over DPDK (cffi API mode) when pkg-config finds libdpdk; otherwise installs
without it, and the transport's probe says what to install (rlbench_dpdk.native.probe)."""

import shutil
import subprocess

from setuptools import setup


def _libdpdk_found() -> bool:
    if shutil.which("pkg-config") is None:
        return False
    return subprocess.run(["pkg-config", "--exists", "libdpdk"], check=False).returncode == 0


setup(cffi_modules=["rlbench_dpdk/_build_ffi.py:ffibuilder"] if _libdpdk_found() else [])
