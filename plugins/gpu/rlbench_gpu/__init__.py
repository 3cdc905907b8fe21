"""rlbench-gpu: compute `gpu`, replay `gpu` and environments `gpu/CartPole-v1`, `gpu/Pendulum-v1`.

Every class takes a `device` ("cuda", "cuda:1", 1 or "cpu"): the registered components require
CUDA (their probe says why not), while tests build the same classes with device="cpu".
Importing this package imports nothing heavy; torch is loaded by the modules that need it.
"""

__version__ = "0.1.0"
