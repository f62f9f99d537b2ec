"""The EMA law of the key encoder (I7)."""

import copy

import pytest
import torch
from hypothesis import example, given
from torch import nn

from moco_ref import momentum_update
from tests.helpers.strategies import momenta, parameter_sets, seeds


def _holder(shapes, seed, dtype=torch.float64) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    module = nn.Module()
    for i, shape in enumerate(shapes):
        values = torch.randn(tuple(shape), generator=generator, dtype=dtype)
        module.register_parameter(f"p{i}", nn.Parameter(values))
    module.register_buffer("stat", torch.randn(3, generator=generator, dtype=dtype))
    return module


@given(shapes=parameter_sets(), m=momenta, key_seed=seeds, query_seed=seeds)
@example(shapes=[[2]], m=0.9, key_seed=0, query_seed=1)
def test_ema_law_over_parameters(shapes, m, key_seed, query_seed):
    """θk ← m·θk + (1 − m)·θq, computed independently in numpy; buffers untouched."""
    key, query = _holder(shapes, key_seed), _holder(shapes, query_seed)
    key_before = {n: p.detach().numpy().copy() for n, p in key.named_parameters()}
    query_before = {n: p.detach().numpy().copy() for n, p in query.named_parameters()}
    key_stat, query_stat = key.stat.clone(), query.stat.clone()
    momentum_update(key, query, m)
    for name, param in key.named_parameters():
        expected = m * key_before[name] + (1 - m) * query_before[name]
        assert param.detach().numpy() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    for name, param in query.named_parameters():
        assert (param.detach().numpy() == query_before[name]).all(), "query must not move"
    assert torch.equal(key.stat, key_stat) and torch.equal(query.stat, query_stat)


@given(shapes=parameter_sets(), m=momenta, seed=seeds)
def test_update_of_a_copy_is_an_exact_no_op(shapes, m, seed):
    """When θk equals θq the update leaves θk bitwise unchanged (the I6 premise)."""
    query = _holder(shapes, seed, dtype=torch.float32)
    key = copy.deepcopy(query)
    momentum_update(key, query, m)
    for pk, pq in zip(key.parameters(), query.parameters()):
        assert torch.equal(pk, pq)


def test_extreme_momenta_freeze_or_copy_exactly():
    key, query = _holder([[4]], 1), _holder([[4]], 2)
    frozen = key.p0.detach().clone()
    momentum_update(key, query, 1.0)
    assert torch.equal(key.p0, frozen)
    momentum_update(key, query, 0.0)
    assert torch.equal(key.p0, query.p0)


def test_update_records_no_autograd_history():
    key, query = _holder([[3], [2, 2]], 1), _holder([[3], [2, 2]], 2)
    momentum_update(key, query, 0.5)
    for param in key.parameters():
        assert param.grad is None and param.grad_fn is None and param.is_leaf
    assert all(p.grad is None for p in query.parameters())


@pytest.mark.parametrize(
    ("m", "error"), [(-0.01, ValueError), (1.5, ValueError), (True, TypeError), ("0.9", TypeError)]
)
def test_rejects_momentum_outside_unit_interval(m, error):
    key, query = _holder([[2]], 0), _holder([[2]], 1)
    with pytest.raises(error, match="m must"):
        momentum_update(key, query, m)


@pytest.mark.parametrize(
    ("key_shapes", "query_shapes", "needle"),
    [([[2]], [[3]], "'p0' is \\[2\\]"), ([[2]], [[2], [1]], "has 1, query_model has 2")],
)
def test_rejects_models_whose_parameters_do_not_match(key_shapes, query_shapes, needle):
    with pytest.raises(ValueError, match=needle):
        momentum_update(_holder(key_shapes, 0), _holder(query_shapes, 1), 0.9)


def test_rejects_dtype_mismatch_and_non_modules():
    with pytest.raises(ValueError, match="float32"):
        momentum_update(_holder([[2]], 0), _holder([[2]], 1, dtype=torch.float32), 0.9)
    with pytest.raises(TypeError, match="nn.Module"):
        momentum_update(torch.zeros(2), _holder([[2]], 1), 0.9)
