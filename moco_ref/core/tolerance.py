"""The one rule for "equal within tolerance", shared by the goldens and the refactor guard:
``|got − expected| ≤ atol + rtol·|expected|`` elementwise, NaN equal to NaN."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class NotComparable(ValueError):
    """The values are not numbers of one shape; the caller compares them another way."""

    def __init__(self, reason: str, shapes: tuple[list[int], list[int]] | None = None) -> None:
        super().__init__(reason)
        self.shapes = shapes  # (expected, got) when both are numbers, of different shapes


@dataclass(frozen=True)
class Mismatch:
    count: int  # entries beyond tolerance
    size: int
    max_abs: float  # over all entries
    max_rel: float  # over the entries beyond tolerance
    index: tuple[int, ...]  # the worst entry beyond tolerance
    expected: float
    got: float


def mismatch(expected, got, rtol: float, atol: float) -> Mismatch | None:
    """None when ``got`` equals ``expected`` within tolerance, else where and by how much."""
    try:
        want, have = np.asarray(expected, dtype=np.float64), np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        raise NotComparable("not numbers") from None
    if want.shape != have.shape:
        raise NotComparable("shapes differ", (list(want.shape), list(have.shape)))
    error = np.where(np.isnan(want) & np.isnan(have), 0.0, np.abs(have - want))
    bad = (error > atol + rtol * np.abs(want)) | (np.isnan(want) != np.isnan(have))
    if not bad.any():
        return None
    worst = np.unravel_index(int(np.argmax(np.where(bad, error, -1.0))), want.shape) \
        if want.shape else ()
    relative = error / np.maximum(np.abs(want), np.finfo(np.float64).tiny)
    return Mismatch(int(bad.sum()), int(bad.size), float(error.max()), float(relative[bad].max()),
                    tuple(int(i) for i in worst), float(want[worst]), float(have[worst]))
