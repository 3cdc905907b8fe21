"""Native parts of the core, built by `pip install` (gcc and the Python headers are required).

Plain CPython extensions: their per-call overhead (~0.1 us) is what lets prioritized replay update
256 priorities in a few microseconds; ctypes or cffi in ABI mode cost 1-3 us per call.

rlbench._wire (the wire's codec and the replay node's fast path) also needs numpy's C headers at
build time (pyproject's build requirements list numpy); without them it is not built, and the
runtime says so (`rlbench.runtime.distributed.messages.NATIVE`) and runs the same protocol in Python.
"""

import sys

from setuptools import Extension, setup

COMPILE_ARGS = ["-O3", "-std=c11", "-Wall", "-Wno-unused-function"]

extensions = [
    Extension("rlbench._sumtree", ["rlbench/_native/sumtree.c"], depends=["rlbench/_native/sumtree.h"],
              extra_compile_args=COMPILE_ARGS),
    Extension("rlbench._tabular", ["rlbench/_native/tabular.c"], extra_compile_args=COMPILE_ARGS),
    Extension("rlbench._frames", ["rlbench/_native/frames.c"], extra_compile_args=COMPILE_ARGS),
]
try:
    import numpy
except ImportError:
    print("rlbench: numpy is not importable at build time: rlbench._wire (the native wire codec and replay "
          "node fast path) is not built; the runtime uses messages.py's codec alone", file=sys.stderr)
else:
    extensions.append(Extension("rlbench._wire", ["rlbench/_native/wire.c"], include_dirs=[numpy.get_include()],
                                depends=["rlbench/_native/sumtree.h"], extra_compile_args=COMPILE_ARGS))

setup(ext_modules=extensions)
