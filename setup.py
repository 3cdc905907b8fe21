"""Native parts of the core, built by `pip install` (gcc and the Python headers are required).

Plain CPython extensions: their per-call overhead (~0.1 us) is what lets prioritized replay update
256 priorities in a few microseconds; ctypes or cffi in ABI mode cost 1-3 us per call.
"""

from setuptools import Extension, setup

COMPILE_ARGS = ["-O3", "-std=c11", "-Wall", "-Wno-unused-function"]

setup(
    ext_modules=[
        Extension("rlbench._sumtree", ["rlbench/_native/sumtree.c"], extra_compile_args=COMPILE_ARGS),
        Extension("rlbench._tabular", ["rlbench/_native/tabular.c"], extra_compile_args=COMPILE_ARGS),
    ]
)
