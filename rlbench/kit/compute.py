"""For compute-backend authors: the checks of an inference engine's inputs, with the errors users see.

- `check_activation(name)`: one of ACTIVATIONS, or a did-you-mean error.
- `check_mlp_weights(layer_sizes, weights)`: [W0, b0, W1, b1, ...] with W of shape (in, out).

Convolutional engines (`cnn_inference`) find theirs in `rlbench.kit.networks` (check_cnn_weights,
check_observation_batch), tabular engines in `rlbench.kit.tabular`.
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

import numpy as np

from rlbench.errors import RlbenchError

ACTIVATIONS = ("relu", "tanh", "identity")


def check_activation(name: str) -> str:
    """Return `name` if it is one of ACTIVATIONS; otherwise an RlbenchError with a did-you-mean."""
    if name not in ACTIVATIONS:
        close = difflib.get_close_matches(name, ACTIVATIONS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(ACTIVATIONS)}"
        raise RlbenchError(f"unknown activation {name!r}{hint}")
    return name


def check_mlp_weights(layer_sizes: Sequence[int], weights: Sequence[Any]) -> None:
    """Refuse weights that do not fit `layer_sizes` ([W0, b0, W1, b1, ...], W of shape (in, out))."""
    n_layers = len(layer_sizes) - 1
    if len(weights) != 2 * n_layers:
        raise RlbenchError(f"an MLP with layer sizes {list(layer_sizes)} takes {2 * n_layers} arrays "
                           f"[W0, b0, ...], got {len(weights)}")
    for i in range(n_layers):
        expected_w, expected_b = (layer_sizes[i], layer_sizes[i + 1]), (layer_sizes[i + 1],)
        w_shape, b_shape = tuple(np.shape(weights[2 * i])), tuple(np.shape(weights[2 * i + 1]))
        if w_shape != expected_w or b_shape != expected_b:
            raise RlbenchError(f"layer {i}: expected W {expected_w} and b {expected_b} (W is (in, out)), "
                               f"got W {w_shape} and b {b_shape}")
