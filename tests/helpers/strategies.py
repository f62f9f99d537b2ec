"""Hypothesis strategies for the reference's own tests, in one place."""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from torch import nn

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
