"""Batched MLP inference as one generated single-work-item OpenCL kernel (an actor's policy).

The kernel is generated for the exact layer sizes and activations, so every loop bound is a constant
the FPGA compiler can unroll. Each layer's outputs are computed in vectors of WIDTH lanes (1..16,
the smallest power of two covering the layer, capped at 16): one input activation times one weight
row of WIDTH lanes per step, the dot products kept in registers. All weights and biases sit in one
buffer, each layer's W (in, out) zero-padded to whole vectors, so a load is one upload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyopencl as cl

from rlbench.kit.compute import check_activation, check_mlp_weights
from rlbench.errors import RlbenchError
from rlbench_fpga.program import build

ACTIVATION_CODE = {"relu": "fmax({v}, 0.0f)", "tanh": "tanh({v})", "identity": "{v}"}


@dataclass(frozen=True)
class LayerPlan:
    n_in: int
    n_out: int
    width: int  # vector lanes
    blocks: int  # vectors per output row
    weight_offset: int  # floats into the parameter buffer
    bias_offset: int

    @property
    def padded(self) -> int:
        return self.width * self.blocks


def plan_layers(layer_sizes: Sequence[int]) -> tuple[list[LayerPlan], int]:
    plans, offset = [], 0
    for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:]):
        width = min(16, 1 << (n_out - 1).bit_length())
        blocks = -(-n_out // width)
        plan = LayerPlan(n_in, n_out, width, blocks, offset, offset + n_in * width * blocks)
        plans.append(plan)
        offset = plan.bias_offset + plan.padded
    return plans, offset


def kernel_source(layer_sizes: Sequence[int], hidden: str, output: str) -> str:
    plans, _ = plan_layers(layer_sizes)
    lines = [
        "#ifdef cl_intel_channels",
        "#define TASK __attribute__((max_global_work_dim(0))) __attribute__((reqd_work_group_size(1, 1, 1)))",
        "#else",
        "#define TASK __attribute__((reqd_work_group_size(1, 1, 1)))",
        "#endif",
        "TASK __kernel void mlp_forward(__global const float *restrict x, __global const float *restrict p,",
        "                               __global float *restrict y, int batch) {",
        "    for (int s = 0; s < batch; s++) {",
        f"        float h0[{layer_sizes[0]}];",
        f"        for (int i = 0; i < {layer_sizes[0]}; i++) h0[i] = x[s * {layer_sizes[0]} + i];",
    ]
    for index, plan in enumerate(plans):
        vec = "float" if plan.width == 1 else f"float{plan.width}"
        load = (lambda at: f"p[{at}]") if plan.width == 1 else (lambda at, w=plan.width: f"vload{w}(0, p + {at})")
        store = (lambda v, at: f"h{index + 1}[{at}] = {v};") if plan.width == 1 else \
            (lambda v, at, w=plan.width: f"vstore{w}({v}, 0, h{index + 1} + {at});")
        activation = ACTIVATION_CODE[output if index == len(plans) - 1 else hidden]
        lines += [
            f"        float h{index + 1}[{plan.padded}];",
            "        {",
            f"            {vec} acc[{plan.blocks}];",
            "            #pragma unroll",
            f"            for (int b = 0; b < {plan.blocks}; b++) acc[b] = {load(f'{plan.bias_offset} + b * {plan.width}')};",
            f"            for (int i = 0; i < {plan.n_in}; i++) {{",
            f"                float v = h{index}[i];",
            "                #pragma unroll",
            f"                for (int b = 0; b < {plan.blocks}; b++)",
            f"                    acc[b] += v * {load(f'{plan.weight_offset} + (i * {plan.blocks} + b) * {plan.width}')};",
            "            }",
            "            #pragma unroll",
            f"            for (int b = 0; b < {plan.blocks}; b++) {store(activation.format(v='acc[b]'), f'b * {plan.width}')}",
            "        }",
        ]
    n_out = layer_sizes[-1]
    lines += [f"        for (int j = 0; j < {n_out}; j++) y[s * {n_out} + j] = h{len(plans)}[j];", "    }", "}"]
    return "\n".join(lines) + "\n"


def pack_parameters(layer_sizes: Sequence[int], weights: Sequence[Any]) -> np.ndarray:
    plans, total = plan_layers(layer_sizes)
    packed = np.zeros(total, dtype=np.float32)
    for plan, w, b in zip(plans, weights[0::2], weights[1::2]):
        rows = packed[plan.weight_offset:plan.bias_offset].reshape(plan.n_in, plan.padded)
        rows[:, :plan.n_out] = np.asarray(w, dtype=np.float32)
        packed[plan.bias_offset:plan.bias_offset + plan.n_out] = np.asarray(b, dtype=np.float32)
    return packed


class OpenclMLP:
    """InferenceEngine on the OpenCL device. `load` uploads a packed copy of the weights."""

    def __init__(self, context: Any, layer_sizes: Sequence[int], *, hidden_activation: str = "relu",
                 output_activation: str = "identity") -> None:
        try:
            sizes = tuple(int(n) for n in layer_sizes)
        except (TypeError, ValueError):
            raise RlbenchError(f"layer sizes must be positive ints, got {layer_sizes!r}") from None
        if len(sizes) < 2 or min(sizes) < 1:
            raise RlbenchError(f"layer sizes must be at least two positive ints, got {list(layer_sizes)}")
        self.layer_sizes = sizes
        self.hidden_activation = check_activation(hidden_activation)
        self.output_activation = check_activation(output_activation)
        self._context = context
        self._queue = cl.CommandQueue(context)
        program = build(context, "mlp", {"sizes": sizes, "activations": (hidden_activation, output_activation)},
                        source=kernel_source(sizes, hidden_activation, output_activation))
        self._kernel = cl.Kernel(program, "mlp_forward")
        self._parameters: Any = None
        self._version = -1
        self._rows = 0
        self._x: Any = None
        self._y: Any = None

    @property
    def version(self) -> int:
        return self._version

    def load(self, weights: Sequence[np.ndarray], version: int) -> None:
        check_mlp_weights(self.layer_sizes, weights)
        packed = pack_parameters(self.layer_sizes, weights)
        buffer = cl.Buffer(self._context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=packed)
        self._parameters, self._version = buffer, int(version)

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        if self._parameters is None:
            raise RlbenchError("the inference engine has no weights yet: call load() first")
        x = np.ascontiguousarray(observations, dtype=np.float32)
        n_in, n_out = self.layer_sizes[0], self.layer_sizes[-1]
        if x.ndim != 2 or x.shape[1] != n_in:
            raise RlbenchError(f"observations must have shape (batch, {n_in}), got {x.shape}")
        batch = x.shape[0]
        y = np.empty((batch, n_out), dtype=np.float32)
        if batch == 0:
            return y
        if batch > self._rows:
            self._rows = max(batch, 2 * self._rows)
            self._x = cl.Buffer(self._context, cl.mem_flags.READ_ONLY, self._rows * n_in * 4)
            self._y = cl.Buffer(self._context, cl.mem_flags.WRITE_ONLY, self._rows * n_out * 4)
        cl.enqueue_copy(self._queue, self._x, x, is_blocking=False)  # x outlives the blocking read below
        self._kernel(self._queue, (1,), (1,), self._x, self._parameters, self._y, np.int32(batch))
        cl.enqueue_copy(self._queue, y, self._y, is_blocking=True)
        return y
