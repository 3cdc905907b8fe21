"""cffi API-mode build of the shim. `set_source_pkgconfig` asks pkg-config for libdpdk's flags."""

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "csrc", "rlb_dpdk.h")


def _declarations() -> str:
    """The header's prototypes and constants, without preprocessor lines cffi cannot parse."""
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    stats_n = re.search(r"^#define RLB_STATS_N (\d+)$", text, flags=re.M).group(1)
    return "\n".join(lines) + f"\n#define RLB_STATS_N {stats_n}\n"


ffibuilder = FFI()
ffibuilder.cdef(_declarations())
ffibuilder.set_source_pkgconfig(
    "rlbench_dpdk._native",
    ["libdpdk"],
    '#include "rlb_dpdk.h"',
    sources=[os.path.relpath(os.path.join(HERE, "csrc", "rlb_dpdk.c"))],
    include_dirs=[os.path.join(HERE, "csrc")],
    extra_compile_args=["-O2", "-Wall", "-Wno-address-of-packed-member"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
