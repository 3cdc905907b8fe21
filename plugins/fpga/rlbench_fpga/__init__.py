"""rlbench-fpga: PEARL's FPGA side (K-ary sum-tree prioritized replay, MLP inference, tabular TD)
as OpenCL kernels through pyopencl, with an analytical model of a real board.

Importing this package is cheap; the OpenCL modules (device, replay, compute) import pyopencl.
"""

__version__ = "0.1.0"
