"""Torch networks for learners (MLPs for vectors, the CNNs of rlbench.kit.networks for images), and
their export in the format actors' inference engines load.

Learner-side only: importing this module imports torch.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch
from torch import nn

from rlbench.kit.networks import ConvNetSpec

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "identity": nn.Identity}


def mlp(layer_sizes: Sequence[int], *, hidden_activation: str = "relu", output_activation: str = "identity",
        device: torch.device | None = None) -> nn.Sequential:
    """Linear layers with `hidden_activation` between them; torch's default initialisation."""
    layers: list[nn.Module] = []
    last = len(layer_sizes) - 2
    for i, (n_in, n_out) in enumerate(zip(layer_sizes[:-1], layer_sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        layers.append(_ACTIVATIONS[output_activation if i == last else hidden_activation]())
    return nn.Sequential(*layers).to(device)


class ScaledFloat(nn.Module):
    """The first layer of a network on uint8 frames: the cast to float32 and the scale (1/255 for
    pixels), on the network's device, so frames stay uint8 through memories, wire and batches."""

    def __init__(self, input_shape: Sequence[int], scale: float) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.scale = float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, *self.input_shape).to(torch.float32)  # (batch, H, W) boards gain their channel
        return x * self.scale if self.scale != 1.0 else x

    def extra_repr(self) -> str:
        return f"input_shape={self.input_shape}, scale={self.scale:.6g}"


def conv_net(network: ConvNetSpec, device: torch.device | None = None) -> nn.Sequential:
    """The torch module of a ConvNetSpec: cast and scale, convolutions with ReLU, flatten, ReLU hidden
    layers, linear output; torch's default initialisation (as CleanRL's dqn_atari.py)."""
    layers: list[nn.Module] = [ScaledFloat(network.input_shape, network.scale)]
    channels = network.input_shape[0]
    for out, kernel, stride in network.convs:
        layers += [nn.Conv2d(channels, out, kernel, stride=stride), nn.ReLU()]
        channels = out
    layers.append(nn.Flatten())
    layers += list(mlp([network.flat_features, *network.hidden, network.n_outputs]))
    return nn.Sequential(*layers).to(device)


def build_network(network: Sequence[int] | ConvNetSpec, device: torch.device | None = None) -> nn.Sequential:
    """A network from its description: conv_net for a ConvNetSpec, mlp (ReLU hidden) for layer sizes."""
    return conv_net(network, device) if isinstance(network, ConvNetSpec) else mlp(network, device=device)


def export_weights(network: nn.Module) -> list[np.ndarray]:
    """[W0, b0, W1, b1, ...] as float32 numpy copies, layer by layer: a Linear's W of shape (in, out)
    (torch stores (out, in)), a Conv2d's as torch keeps it (out, in, kh, kw) — ConvNetSpec.weight_shapes()'s
    order for a conv_net. Each is one plain copy of the parameter (moved off its device); a Linear's
    (in, out) is the transposed view of its copy (Fortran order): a transposing copy of the Nature CNN's
    3136x512 layer took ~5 ms per publication on one thread where a plain one takes well under one, and
    matmul reads either order at the same speed (the wire makes what it sends C-contiguous)."""
    arrays: list[np.ndarray] = []
    with torch.no_grad():
        for layer in network.modules():
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                for source in (layer.weight, layer.bias):
                    copy = torch.empty(source.shape, dtype=torch.float32).copy_(source).numpy()
                    arrays.append(copy.T if isinstance(layer, nn.Linear) and copy.ndim == 2 else copy)
    return arrays


def adam(parameters: Iterable[nn.Parameter], lr: float) -> torch.optim.Adam:
    """Adam, with torch's fused kernel where it has one for the parameters' device: one pass per
    tensor instead of about ten (a 256-256 MLP's step on one CPU thread: 55 us against 159). The same
    update rule, so results differ only in rounding."""
    parameters = list(parameters)
    try:
        return torch.optim.Adam(parameters, lr=lr, fused=True)
    except (RuntimeError, ValueError):  # no fused kernel for this device or torch version
        return torch.optim.Adam(parameters, lr=lr)


def capturable_adam(parameters: Iterable[nn.Parameter], lr: float) -> torch.optim.Adam:
    """Adam whose step never reads the device from the host, for learners captured in CUDA graphs:
    fused (the step count is a device tensor and one kernel updates every parameter; the default
    implementation keeps it on the host and calls .item()), and capturable on an accelerator (torch
    refuses to capture a step that is not)."""
    parameters = list(parameters)
    return torch.optim.Adam(parameters, lr=lr, fused=True, capturable=parameters[0].device.type != "cpu")


def as_tensor(array: np.ndarray, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A sampled numpy batch on the learner's device, as `dtype` (uint8 for frames: a CNN casts them
    there, so they cross to an accelerator at a quarter of float32's bytes). No copy on the CPU when
    the dtype matches and the array is writable: torch cannot share a read-only buffer, such as a view
    of an OpenCL memory's mapped batch, without warning in every process that a write would be undefined."""
    if isinstance(array, np.ndarray) and not array.flags.writeable:  # a device memory's batch is a tensor already
        array = array.copy()
    return torch.as_tensor(array, dtype=dtype, device=device)


def soft_update(target: nn.Module, source: nn.Module, tau: float | torch.Tensor) -> None:
    """target <- tau * source + (1 - tau) * target (tau = 1 copies), all parameters in one foreach call.
    tau may be a 0-dim device tensor (a schedule decided on the device): lerp is exact at 0 and 1."""
    with torch.no_grad():
        targets, sources = list(target.parameters()), list(source.parameters())
        if isinstance(tau, torch.Tensor):
            # One weight tensor per parameter: given a lone tensor, foreach_lerp_ takes its Scalar
            # overload, which reads it on the host (.item(), a sync that a CUDA graph refuses).
            torch._foreach_lerp_(targets, sources, [tau] * len(targets))
        elif tau >= 1.0:
            for t, s in zip(targets, sources):
                t.copy_(s)
        else:
            torch._foreach_lerp_(targets, sources, tau)


def state_of(owner: object, names: Sequence[str]) -> dict[str, object]:
    """A learner's checkpoint: the state dicts of its networks and optimizers `names`, its update count."""
    return {**{name: getattr(owner, name).state_dict() for name in names}, "updates": owner.updates}


def load_state(owner: object, names: Sequence[str], state: dict[str, object]) -> None:
    """The inverse of state_of, into a learner built with the same configuration (its tensors stay its
    own: values are copied in, on its device)."""
    for name in names:
        getattr(owner, name).load_state_dict(state[name])
    owner.updates = int(state["updates"])
