"""The emulated DPU program is C (rlbench_upmem/_native/pim.c), built by `pip install`: a Python loop
per DPU runs at ~2.6 M updates/s, far below what 1,024 emulated DPUs need.

-ffp-contract=off keeps the FP32 program's rounding that of separate IEEE multiply and add, as the
DPU's software float routines would round, rather than fused multiply-adds.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("rlbench_upmem._pim", ["rlbench_upmem/_native/pim.c"],
                  extra_compile_args=["-O3", "-std=c11", "-Wall", "-ffp-contract=off"]),
    ]
)
