"""Argument checks for component authors: each refuses bad input with one clear line, raised as the
caller's own error class (an RlbenchError, so the CLI prints it without a traceback)."""

from __future__ import annotations

import math
import operator
from typing import Any

from rlbench.errors import RlbenchError


def positive_int(value: Any, what: str, error: type[Exception] = RlbenchError) -> int:
    """An integer >= 1 (bools are refused: True is not a capacity)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise error(f"{what} must be an integer, got {value!r}") from None
    if number < 1:
        raise error(f"{what} must be at least 1, got {number}")
    return number


def non_negative(value: Any, what: str, error: type[Exception] = RlbenchError) -> float:
    """A finite number >= 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise error(f"{what} must be a number, got {value!r}") from None
    if not (number >= 0.0 and math.isfinite(number)):
        raise error(f"{what} must be a finite number >= 0, got {value!r}")
    return number
