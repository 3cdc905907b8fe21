"""One launch for many steps: a function of device work captured once and replayed.

What an H100 taught (plugins/gpu/README.md, "What the hardware taught"): a small RL step is dozens
of tiny kernels, each launched from the host at ~7 us (a replay cycle: 73 kernels, ~1.9 ms of host
time, ~0.17 ms of GPU work): the GPU idled ~90 % of the time. Replaying the kernels as one CUDA
graph removes the launch cost (~10x measured on a DQN update); compiling them with inductor first
fuses kernels as well (~20x). Modes:

- "graph" (the default): the function's eager kernels in one CUDA graph. No compile time.
- "compile": the function compiled by torch.compile (inductor, no graphs of its own), then the
  compiled kernels captured in one CUDA graph the same way. Compile time comes first (reported
  apart by `rlbench gpu bench`); which mode is faster on a given card is for that card to say.
- "eager": the function as it is, every call (the reference, and the CPU device's only mode).

A captured function must not touch host state that changes between calls (its Python runs once,
at capture), must not read device values on the host, must not make tensors from host data, and
must keep its shapes. Calls before the capture (`warmup`, on a side stream as torch's CUDA-graph
notes ask) run eagerly and do real work, so optimizers and memories allocate their state before
the capture; the capturing call replays the graph once to do its own work (capture records but
does not run).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from rlbench_gpu.device import GpuError

CAPTURE_MODES = ("graph", "compile", "eager")
WARMUP_CALLS = 2  # eager calls before the capture: lazy state (Adam's moments, replay columns) allocated


class CapturedLaunch:
    """launch() runs `function()` once: eagerly for the first WARMUP_CALLS calls (and always in mode
    "eager" or on the CPU device), then as a replay of the CUDA graph the next call captures."""

    def __init__(self, function: Callable[[], None], *, device: torch.device, mode: str = "graph",
                 generators: Sequence[torch.Generator] = ()) -> None:
        if mode not in CAPTURE_MODES:
            raise GpuError(f"capture mode must be one of {', '.join(CAPTURE_MODES)}, got {mode!r}")
        self.device = device
        self.mode = mode if device.type == "cuda" else "eager"
        self.function = torch.compile(function) if self.mode == "compile" else function
        self.generators = [g for g in generators if g is not None]
        self.calls = 0
        self.graph: Any = None

    def __call__(self) -> None:
        self.calls += 1
        if self.mode == "eager":
            self.function()
        elif self.graph is not None:
            self.graph.replay()
        elif self.calls <= WARMUP_CALLS:
            self._warm_up()
        else:
            self._capture()
            self.graph.replay()

    def _warm_up(self) -> None:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self.function()
        current.wait_stream(side)

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        for generator in self.generators:
            graph.register_generator_state(generator)
        with torch.cuda.graph(graph):
            self.function()
        self.graph = graph

    def describe(self) -> str:
        if self.mode == "eager":
            return "eager (every kernel launched from the host)" + (" on the CPU device" if self.device.type == "cpu"
                                                                    else "")
        what = "torch.compile (inductor) kernels" if self.mode == "compile" else "eager kernels"
        return f"{what} in one CUDA graph per launch, captured after {WARMUP_CALLS} eager launches"
