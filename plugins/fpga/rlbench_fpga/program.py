"""Building the kernels: OpenCL C from kernels/*.cl with the host's #defines, or a precompiled board
binary (.aocx for Intel FPGA boards, .xclbin for AMD/Xilinx) named by RLBENCH_FPGA_BINARY_DIR.

Defines go into the source text (not -D options) so values with spaces or braces need no quoting.
Programs are cached per (context, kernel file, defines): building one on PoCL takes ~0.1-1 s.
"""

from __future__ import annotations

import os
import warnings
from functools import cache
from importlib.resources import files
from typing import Any, Mapping

import pyopencl as cl

from rlbench_fpga.device import OpenclDeviceError

BINARY_DIR_ENV = "RLBENCH_FPGA_BINARY_DIR"
BINARY_SUFFIXES = (".aocx", ".xclbin")


@cache
def kernel_source(name: str) -> str:
    return files("rlbench_fpga").joinpath("kernels", name).read_text()


def source_with_defines(name: str, defines: Mapping[str, Any]) -> str:
    header = "".join(f"#define {key} {value}\n" for key, value in defines.items())
    return header + kernel_source(name)


def board_binary(name: str, defines: Mapping[str, Any]) -> str | None:
    """A precompiled binary for this kernel file and configuration, if the user supplied one:
    $RLBENCH_FPGA_BINARY_DIR/<stem>-<KEY=value-...>.aocx (or .xclbin)."""
    directory = os.environ.get(BINARY_DIR_ENV)
    if not directory:
        return None
    stem = name.rsplit(".", 1)[0] + "".join(f"-{k}={v}" for k, v in sorted(defines.items()) if isinstance(v, int))
    for suffix in BINARY_SUFFIXES:
        path = os.path.join(directory, stem + suffix)
        if os.path.exists(path):
            return path
    return None


_programs: dict[tuple, Any] = {}


def build(context: Any, name: str, defines: Mapping[str, Any], source: str | None = None) -> Any:
    """The program for kernels/<name> with `defines` (or for generated `source`, cached by its text)."""
    key = (id(context), name, tuple(sorted((k, str(v)) for k, v in defines.items())), source)
    program = _programs.get(key)
    if program is not None:
        return program
    binary = board_binary(name, defines)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            if binary is not None:
                with open(binary, "rb") as handle:
                    program = cl.Program(context, context.devices, [handle.read()]).build()
            else:
                text = source if source is not None else source_with_defines(name, defines)
                program = cl.Program(context, text).build(options=["-cl-std=CL1.2"])
    except cl.Error as error:
        what = binary or name
        first_lines = " | ".join(str(error).strip().splitlines()[:6])
        raise OpenclDeviceError(f"building {what} for {context.devices[0].name.strip()} failed: {first_lines}") from None
    _programs[key] = program
    return program
