"""For compute-backend and algorithm authors: the convolutional networks rlbench runs on image
observations, described as data (no torch here), so a learner, an actor's inference engine on any
backend, the wire's size check and the planner agree on one network and one weights order.

- `ConvNetSpec`: input (channels, height, width) of a dtype, conv layers (out channels, kernel,
  stride; ReLU after each, no padding), then ReLU hidden layers and a linear output.
  `weight_shapes()` is the order weights are published and loaded in:
  [conv0 W (out, in, kh, kw), conv0 b, ..., fc0 W (in, out), fc0 b, ...] — conv kernels as torch keeps
  them, fully connected ones (in, out) as every MLP in rlbench.
- `nature_cnn(input_shape, n_outputs)`: Mnih et al. 2015's network (32x8/4, 64x4/2, 64x3/1, 512), the
  one CleanRL's dqn_atari.py trains on 84x84x4 frames; uint8 input scaled by 1/255.
- `minatar_cnn(input_shape, n_outputs)`: Young & Tian 2019's MinAtar network (16x3/1, 128) on its
  0/1 boards (channels first, uint8), not scaled.
- `image_network(observation_shape, observation_dtype, n_outputs)`: which of the two an image
  observation gets (minatar for boards at most SMALL_BOARD wide, nature otherwise).
- `check_cnn_weights(network, weights)`: refuse weights that do not fit it.
- `check_observation_batch(network, shape)`: refuse a batch of observations that is not (batch, C, H, W),
  or (batch, H, W) for a one-channel input (an image_network of a 2-dimensional observation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rlbench.errors import RlbenchError

NATURE_CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
NATURE_HIDDEN = (512,)
MINATAR_CONVS = ((16, 3, 1),)
MINATAR_HIDDEN = (128,)
SMALL_BOARD = 36  # an image at most this high and wide gets MinAtar's network (MinAtar's boards are 10x10)


@dataclass(frozen=True)
class ConvNetSpec:
    """A convolutional Q-network as data: convolutions, then ReLU dense layers, then `n_outputs`; its
    weights are in `weight_shapes()` order. Refuses (RlbenchError) a network whose convolutions leave no output."""

    input_shape: tuple[int, int, int]  # (channels, height, width): channels first, as torch convolves
    convs: tuple[tuple[int, int, int], ...]  # (out channels, kernel, stride) per layer
    hidden: tuple[int, ...]  # widths of the ReLU fully connected layers after the convolutions
    n_outputs: int
    input_dtype: str = "uint8"
    scale: float = 1.0 / 255.0  # the input is multiplied by this after the cast to float32
    name: str = "cnn"

    def __post_init__(self) -> None:
        if len(self.input_shape) != 3 or min(self.input_shape) < 1:
            raise RlbenchError(f"a convolutional network takes (channels, height, width) inputs, got {self.input_shape}")
        if not self.convs or self.n_outputs < 1:
            raise RlbenchError("a convolutional network needs at least one conv layer and one output")
        height, width = self.conv_output_hw()
        if height < 1 or width < 1:
            raise RlbenchError(f"{self.name}: inputs of {self.input_shape[1]}x{self.input_shape[2]} are too small for "
                               f"its convolutions {list(self.convs)}")

    def conv_output_hw(self) -> tuple[int, int]:
        """(height, width) of the last convolution's output."""
        height, width = self.input_shape[1], self.input_shape[2]
        for _, kernel, stride in self.convs:
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        return height, width

    @property
    def flat_features(self) -> int:
        """What the last convolution hands the first fully connected layer (Nature on 84x84: 3136)."""
        height, width = self.conv_output_hw()
        return self.convs[-1][0] * height * width

    def weight_shapes(self) -> list[tuple[int, ...]]:
        """The shapes of its weights in order: each convolution's (out, in, k, k) and (out,), then each
        dense layer's (in, out) and (out,)."""
        shapes: list[tuple[int, ...]] = []
        channels = self.input_shape[0]
        for out, kernel, _ in self.convs:
            shapes += [(out, channels, kernel, kernel), (out,)]
            channels = out
        sizes = [self.flat_features, *self.hidden, self.n_outputs]
        for fan_in, fan_out in zip(sizes, sizes[1:]):
            shapes += [(fan_in, fan_out), (fan_out,)]
        return shapes

    def parameters(self) -> int:
        """How many numbers its weights hold."""
        return sum(int(np.prod(shape)) for shape in self.weight_shapes())

    def multiply_adds(self) -> int:
        """Multiply-adds of one forward pass of one observation: out_h * out_w * out_c * in_c * k * k per
        convolution, in * out per dense layer."""
        total = 0
        channels, height, width = self.input_shape
        for out, kernel, stride in self.convs:
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
            total += height * width * out * channels * kernel * kernel
            channels = out
        sizes = [self.flat_features, *self.hidden, self.n_outputs]
        return total + sum(a * b for a, b in zip(sizes, sizes[1:]))


def nature_cnn(input_shape: Sequence[int], n_outputs: int, input_dtype: str = "uint8") -> ConvNetSpec:
    """The Nature DQN network (Mnih et al. 2015) for frames of `input_shape`: uint8 pixels scaled to [0, 1]."""
    # uint8 pixels scaled to [0, 1], as CleanRL's dqn_atari divides by 255
    return ConvNetSpec(tuple(int(n) for n in input_shape), NATURE_CONVS, NATURE_HIDDEN, int(n_outputs),
                       input_dtype=input_dtype, scale=1.0 / 255.0 if input_dtype == "uint8" else 1.0,
                       name="nature-cnn")


def minatar_cnn(input_shape: Sequence[int], n_outputs: int, input_dtype: str = "uint8") -> ConvNetSpec:
    """MinAtar's network (Young and Tian 2019): one 3x3 convolution of 16, 128 hidden; boards taken as
    they are (0/1)."""
    # MinAtar's boards are 0/1 already
    return ConvNetSpec(tuple(int(n) for n in input_shape), MINATAR_CONVS, MINATAR_HIDDEN, int(n_outputs),
                       input_dtype=input_dtype, scale=1.0, name="minatar-cnn")


def image_network(observation_shape: Sequence[int], observation_dtype: str, n_outputs: int) -> ConvNetSpec:
    """The network an image observation of this shape gets: MinAtar's for small boards (at most
    SMALL_BOARD high and wide), Nature's otherwise."""
    shape = tuple(int(n) for n in observation_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3:
        raise RlbenchError(f"an image observation has 2 or 3 dimensions (channels first), got {shape}")
    make = minatar_cnn if max(shape[1:]) <= SMALL_BOARD else nature_cnn
    return make(shape, n_outputs, observation_dtype)


def check_cnn_weights(network: ConvNetSpec, weights: Sequence[Any]) -> None:
    """Refuse weights that do not fit `network` (its weight_shapes(), in order)."""
    expected = network.weight_shapes()
    if len(weights) != len(expected):
        raise RlbenchError(f"{network.name} takes {len(expected)} arrays (conv W, b, ..., fc W, b, ...), got {len(weights)}")
    for i, (want, array) in enumerate(zip(expected, weights)):
        got = tuple(np.shape(array))
        if got != want:
            raise RlbenchError(f"{network.name}: weight {i} should have shape {want}, got {got}")


def check_observation_batch(network: ConvNetSpec, shape: Sequence[int]) -> None:
    """Refuse a batch of observations of this shape that `network` cannot take: (batch, C, H, W), or
    (batch, H, W) where C is 1 (reshape it to (batch, *network.input_shape) to convolve)."""
    shape = tuple(shape)
    one_channel = network.input_shape[0] == 1 and shape[1:] == network.input_shape[1:]
    if len(shape) < 2 or not (shape[1:] == network.input_shape or one_channel):
        expected = ", ".join(map(str, network.input_shape))
        raise RlbenchError(f"{network.name}: observations must have shape (batch, {expected}), got {shape}")
