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
    index: tuple[int | str, ...]  # where the worst entry beyond tolerance sits (list indices,
    # dict keys), at any nesting
    expected: float
    got: float


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _leaves(value, path: tuple, out: list) -> None:
    """``(path, leaf)`` of every leaf of nested lists, tuples and dicts, in order."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            _leaves(value[key], (*path, key), out)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _leaves(item, (*path, i), out)
    elif isinstance(value, np.ndarray):
        _leaves(value.tolist(), path, out)
    else:
        out.append((path, value))


def _rectangular(expected, got):
    """Both as float64 arrays when they are numbers of one rectangular shape, else None."""
    try:
        want, have = np.asarray(expected, dtype=np.float64), np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return (want, have) if want.dtype == np.float64 and have.dtype == np.float64 else None


def mismatch(expected, got, rtol: float, atol: float) -> Mismatch | None:
    """None when ``got`` equals ``expected`` within tolerance, else where and by how much.

    Numbers are compared within tolerance whatever their nesting: a rectangular array, or
    ragged lists and dicts of numbers (e.g. a queue's keys over steps, whose length changes).
    Everything that is not a number (strings, booleans, None) must be equal, and both values
    must have the same structure; otherwise ``NotComparable`` says where they part."""
    arrays = _rectangular(expected, got)
    if arrays is not None and arrays[0].shape == arrays[1].shape:
        want, have = arrays
        paths = None
    elif arrays is not None and _is_rectangular_array(expected) and _is_rectangular_array(got):
        raise NotComparable("shapes differ", (list(arrays[0].shape), list(arrays[1].shape)))
    else:
        mine: list = []
        theirs: list = []
        _leaves(expected, (), mine)
        _leaves(got, (), theirs)
        for (path_a, a), (path_b, b) in zip(mine, theirs):
            if path_a != path_b:
                raise NotComparable(f"structures differ at {list(path_a)} / {list(path_b)}")
            if not (_is_number(a) and _is_number(b)) and a != b:
                raise NotComparable(f"values differ at {list(path_a)}: {a!r} != {b!r}")
        if len(mine) != len(theirs):
            shorter = mine if len(mine) < len(theirs) else theirs
            at = list(shorter[-1][0]) if shorter else []
            raise NotComparable(f"structures differ after {at}: {len(mine)} vs "
                                f"{len(theirs)} entries")
        numbers = [(path, a, b) for (path, a), (_, b) in zip(mine, theirs) if _is_number(a)]
        paths = [path for path, _, _ in numbers]
        want = np.array([a for _, a, _ in numbers], dtype=np.float64)
        have = np.array([b for _, _, b in numbers], dtype=np.float64)
    error = np.where(np.isnan(want) & np.isnan(have), 0.0, np.abs(have - want))
    bad = (error > atol + rtol * np.abs(want)) | (np.isnan(want) != np.isnan(have))
    if not bad.any():
        return None
    flat_worst = int(np.argmax(np.where(bad, error, -1.0)))
    if paths is not None:
        worst_index: tuple = tuple(paths[flat_worst])
        worst = flat_worst
    else:
        worst = np.unravel_index(flat_worst, want.shape) if want.shape else ()
        worst_index = tuple(int(i) for i in worst)
    relative = error / np.maximum(np.abs(want), np.finfo(np.float64).tiny)
    return Mismatch(int(bad.sum()), int(bad.size), float(np.nanmax(error)),
                    float(relative[bad].max()), worst_index, float(want[worst]),
                    float(have[worst]))


def _is_rectangular_array(value) -> bool:
    try:
        return np.asarray(value, dtype=np.float64).dtype == np.float64
    except (TypeError, ValueError):
        return False
