"""What `rlbench fpga bench` measures: fpga beside its CPU peers in one run, plus the board model."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rlbench_fpga import perf_model

MLP_LAYERS = (4, 64, 64, 2)
FLOOR = "opencl-floor"  # not a replay: the round's OpenCL calls with an empty kernel


def run_bench(*, capacity: int, batch_size: int, rounds: int, seconds: float) -> dict[str, Any]:
    from rlbench.kit.bench import interleaved_medians, pin_one_thread
    from rlbench_fpga.device import default_context

    threads: dict[str, Any] = {key: os.environ.get(key) for key in ("POCL_DEVICES", "POCL_MAX_PTHREAD_COUNT", "OMP_NUM_THREADS")}
    threads.update(pin_one_thread())
    info = default_context()[2]
    replay, depth, row_bytes = _replay_subjects(capacity, batch_size)
    replay_us = interleaved_medians(replay, rounds, seconds)
    board = perf_model.DEFAULT_BOARD
    sample = perf_model.sample_seconds(batch_size, 16, depth, row_bytes, board) * 1e6
    update = perf_model.update_seconds(batch_size, depth, board) * 1e6
    mlp_subjects = _mlp_subjects()
    mlp_us = interleaved_medians(mlp_subjects, rounds, seconds)
    return {
        "device": info.as_dict(), "threads": threads, "rounds": rounds, "board": perf_model.describe(board),
        "replay": {"capacity": capacity, "batch_size": batch_size, "fanout": 16, "depth": depth,
                   "measured_us": replay_us, "timing": "measured",
                   "modelled_us": {"sample": sample, "update": update, "round": sample + update, "timing": "modelled"}},
        "mlp": {"layers": list(MLP_LAYERS), "batch": 256, "measured_us": mlp_us, "timing": "measured",
                "ratio_to_torch": mlp_us["fpga"] / mlp_us["torch-cpu"],
                "modelled_us": perf_model.mlp_seconds(256, MLP_LAYERS, board) * 1e6},
    }


def _replay_subjects(capacity: int, batch_size: int) -> tuple[dict[str, Any], int, int]:
    from rlbench.kit.bench import CpprbPrioritized, cartpole_batch, numpy_sumtree_replay_class
    from rlbench_fpga.replay import FpgaReplay

    rng = np.random.default_rng(0)
    memories: dict[str, Any] = {"fpga": FpgaReplay(capacity, alpha=0.6, seed=0, fanout=16),
                                "numpy-sumtree": numpy_sumtree_replay_class()(capacity, alpha=0.6, seed=0)}
    try:
        memories["cpprb"] = CpprbPrioritized(capacity, alpha=0.6)
    except ImportError:
        pass  # reported by its absence; `pip install cpprb` adds it
    for memory in memories.values():
        for begin in range(0, capacity, 100_000):
            n = min(100_000, capacity - begin)
            memory.add(cartpole_batch(rng, n), rng.exponential(1.0, n) + 1e-3)
    pool = 256
    indices = [rng.integers(0, capacity, batch_size, dtype=np.int64) for _ in range(pool)]
    priorities = [rng.exponential(1.0, batch_size).astype(np.float32) + 1e-3 for _ in range(pool)]

    def round_of(memory: Any):
        def call(k: int) -> None:
            memory.sample(batch_size, 0.4)
            memory.update_priorities(indices[k % pool], priorities[k % pool])
        return call

    fpga = memories["fpga"]
    subjects = {name: round_of(memory) for name, memory in memories.items()}
    subjects[FLOOR] = _dispatch_floor(batch_size, fpga.record_bytes)
    return subjects, fpga.depth, fpga.record_bytes


def _dispatch_floor(batch_size: int, row_bytes: int) -> Any:
    """What a sample + update round costs the OpenCL runtime alone: the same upload (indices and
    priorities), one launch and blocking download (indices, weights, rows), with a kernel that does
    nothing. The fpga round cannot be faster than this on the device in use."""
    import pyopencl as cl

    from rlbench_fpga.device import default_context

    context = default_context()[0]
    queue = cl.CommandQueue(context)
    kernel = cl.Kernel(cl.Program(context, "__kernel void nothing(__global uint *out) {}").build(), "nothing")
    upload = np.zeros(2 * batch_size, dtype=np.int32)
    download = np.empty(1 + 2 * batch_size + batch_size * row_bytes // 4, dtype=np.uint32)
    staging = cl.Buffer(context, cl.mem_flags.READ_WRITE, upload.nbytes)
    out = cl.Buffer(context, cl.mem_flags.READ_WRITE, download.nbytes)

    def call(k: int) -> None:
        copy = cl.enqueue_copy(queue, staging, upload, is_blocking=False)
        kernel(queue, (1,), (1,), out)
        cl.enqueue_copy(queue, download, out, is_blocking=True)
        del copy  # complete: it came before the blocking read
    return call


def _mlp_subjects() -> dict[str, Any]:
    from rlbench.kit.bench import torch_forward
    from rlbench.testing.compute import random_weights
    from rlbench_fpga.compute import FpgaCompute

    weights = random_weights(MLP_LAYERS, np.random.default_rng(0))
    engine = FpgaCompute().mlp_inference(MLP_LAYERS)
    engine.load(weights, 1)
    peer = torch_forward(weights, "relu", "identity")
    x = np.random.default_rng(1).standard_normal((256, MLP_LAYERS[0])).astype(np.float32)
    return {"fpga": lambda k: engine(x), "torch-cpu": lambda k: peer(x)}
