"""rlbench-upmem: SwiftRL-style tabular Q-learning and SARSA on UPMEM processing-in-memory.

No UPMEM hardware or SDK is needed: the DPU program runs on an emulator of the UPMEM execution model
(`emulator`), and real-hardware time is predicted by a cost model (`cost_model`), always labelled
"modelled". Importing this package is cheap; the plugin hooks live in `rlbench_upmem.plugin`.
"""

__version__ = "0.1.0"
