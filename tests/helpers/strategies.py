"""Hypothesis strategies for the reference's own tests, in one place."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st
from torch import nn

from moco_ref.probe.wall import WallRule

momenta = st.one_of(st.sampled_from([0.0, 0.5, 0.9, 0.99, 0.999, 1.0]), st.floats(0.0, 1.0))
temperatures = st.sampled_from([0.07, 0.1, 0.2, 0.5, 1.0])
seeds = st.integers(0, 2**31 - 1)


def unit_rows(generator: torch.Generator, rows: int, dim: int, dtype=torch.float64):
    """``[rows, dim]`` random unit vectors."""
    x = torch.randn(rows, dim, generator=generator, dtype=dtype)
    return torch.nn.functional.normalize(x, dim=1)


@st.composite
def tiny_models(draw, in_dim: int = 5, out_dim: int = 4, dtype=torch.float64) -> nn.Module:
    """A small MLP with a buffer-carrying layer, in float64, deterministically initialised."""
    hidden = draw(st.integers(2, 6))
    torch.manual_seed(draw(seeds))
    model = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, out_dim))
    model.register_buffer("running_marker", torch.arange(3, dtype=dtype))
    return model.to(dtype)


@st.composite
def id_batches(draw, max_batches: int = 7, max_batch: int = 9, id_pool: int = 12):
    """A sequence of id batches; ids drawn from a small pool so sources recur and collide."""
    count = draw(st.integers(1, max_batches))
    return [
        draw(st.lists(st.integers(0, id_pool - 1), min_size=1, max_size=max_batch, unique=True))
        for _ in range(count)
    ]


@st.composite
def parameter_sets(draw):
    """Shapes of a model's parameters: 1 to 4 tensors of rank 0 to 3."""
    return draw(
        st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=3), min_size=1, max_size=4)
    )


# --------------------------------------------------------------------------- mutated records
# A mutation is (kind, target, amount): ``target`` picks one of the record's leaves (modulo
# how many there are), ``amount`` sizes the change. ``mutate_record`` applies a list of them.

RECORD_MUTATIONS = ("shape", "width", "values", "dtype", "length", "duplicate", "drop", "none")


@st.composite
def record_mutations(draw, max_mutations: int = 3):
    """One to ``max_mutations`` mutations of an observation record: tensors' shapes, widths,
    values and dtypes, lists' lengths and duplicated entries (repeated steps), dropped keys."""
    return draw(st.lists(st.tuples(st.sampled_from(RECORD_MUTATIONS), st.integers(0, 10**6),
                                   st.integers(1, 7)), min_size=1, max_size=max_mutations))


def _leaves(value, path=()):
    """``(path, value)`` of every tensor, list and dict entry under ``value``."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + (key,), item
            yield from _leaves(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield path + (index,), item
            yield from _leaves(item, path + (index,))


def _set(root, path, value) -> None:
    for key in path[:-1]:
        root = root[key]
    if value is _DROP:
        del root[path[-1]]
    else:
        root[path[-1]] = value


_DROP = object()


def _changed_tensor(kind: str, tensor: torch.Tensor, amount: int):
    if kind == "shape":
        return tensor.reshape(-1) if tensor.ndim != 1 else tensor[: max(len(tensor) - amount, 0)]
    if kind == "width":
        if tensor.ndim == 0:
            return tensor.reshape(1)
        pad = torch.zeros(*tensor.shape[:-1], amount, dtype=tensor.dtype)
        return torch.cat([tensor, pad], dim=-1)
    if kind == "values":
        if tensor.is_floating_point():
            return tensor * (-float(amount)) + (float("nan") if amount == 7 else 0.0)
        return tensor + amount * 997
    if kind == "dtype":
        return tensor.to(torch.float64 if not tensor.is_floating_point() else torch.int64)
    if kind == "length":
        return tensor[: max(len(tensor) // (amount + 1), 0)] if tensor.ndim else tensor
    if kind == "duplicate":
        return torch.cat([tensor, tensor[:amount]]) if tensor.ndim else tensor
    return None


def mutate_record(record: dict, mutations) -> dict:
    """A mutated copy of ``record`` (the original is left as it is)."""
    import copy

    record = copy.deepcopy(record)
    for kind, target, amount in mutations:
        leaves = list(_leaves(record))
        if not leaves:
            break
        path, value = leaves[target % len(leaves)]
        if kind == "drop":
            _set(record, path, _DROP)
        elif kind == "none":
            _set(record, path, None)
        elif isinstance(value, torch.Tensor):
            _set(record, path, _changed_tensor(kind, value, amount))
        elif isinstance(value, list):
            if kind == "duplicate":
                start = amount % max(len(value), 1)
                _set(record, path, value[: start + 1] + value[start:])  # a repeated step
            elif kind in ("length", "shape"):
                _set(record, path, value[: len(value) // (amount + 1)])
        elif isinstance(value, bool):
            _set(record, path, not value)
        elif isinstance(value, (int, float)):
            _set(record, path, value * -amount if kind == "values" else value + amount)
    return record


# --------------------------------------------------------------------------- the process wall
# Small rules, so that drawn values often go beyond their limits; values of plain data only,
# and values with anything a submission may return mixed in.


@st.composite
def wall_rules(draw):
    """A ``probe.wall.WallRule`` with small limits (its lossy ones within its strict ones)."""
    max_depth = draw(st.integers(2, 6))
    max_items = draw(st.integers(2, 7))
    max_text = draw(st.integers(8, 14))
    return WallRule(max_depth=max_depth, max_items=max_items, max_text=max_text,
                    max_tensor_bytes=draw(st.integers(0, 160)),
                    lossy_depth=draw(st.integers(0, max_depth - 2)),
                    lossy_items=draw(st.integers(0, max_items)),
                    repr_text=draw(st.integers(0, max_text)))


@st.composite
def small_tensors(draw) -> torch.Tensor:
    """A plain tensor of up to 27 elements, of one of five dtypes, sometimes transposed."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64, torch.uint8,
                                  torch.bool]))
    tensor = torch.ones(draw(st.lists(st.integers(0, 3), max_size=3)), dtype=dtype)
    return tensor.mT if tensor.ndim >= 2 and draw(st.booleans()) else tensor


def _nested(leaves, keys):
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=8),
        st.lists(inner, max_size=8).map(tuple),
        st.dictionaries(keys, inner, max_size=8),
    ), max_leaves=40)


_plain_leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                          st.text(max_size=16), small_tensors())

plain_values = _nested(_plain_leaves, st.one_of(st.text(max_size=16), st.integers()))


class _LongRepr:
    def __repr__(self) -> str:
        return "a long repr " * 40


_odd_leaves = st.one_of(
    st.complex_numbers(max_magnitude=10, allow_nan=False),
    st.builds(object),
    st.builds(_LongRepr),
    st.binary(max_size=4),
    st.frozensets(st.integers(), max_size=3),
    st.floats(width=32).map(np.float32),
    st.integers(-9, 9).map(np.int64),
    st.booleans().map(np.bool_),
    st.lists(st.floats(width=32), max_size=5).map(lambda xs: np.array(xs, np.float32)),
    st.lists(st.text(max_size=3), max_size=3).map(lambda xs: np.array(xs, dtype=object)),
    small_tensors().map(lambda t: torch.nn.Parameter(t, requires_grad=False)),
    st.builds(lambda: torch.zeros(2, 3).to_sparse()),
)


any_values = _nested(
    st.one_of(_plain_leaves, _odd_leaves),
    st.one_of(st.text(max_size=16), st.integers(), st.none(), st.floats(allow_nan=False),
              st.tuples(st.integers())))
