"""I8 on a loss a module returns itself: one positive scale of the summed cross-entropies
passes; a difference, a dropped or a reweighted half is found, with the halves' weights."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moco_ref.judge.invariants.returned_loss import fit_returned_loss

cross_entropy = st.floats(0.05, 12.0)
steps = st.lists(st.tuples(cross_entropy, cross_entropy), min_size=3, max_size=12)


@given(steps, st.floats(0.01, 10.0))
def test_a_positive_scale_of_the_sum_is_the_official_loss(halves, scale):
    losses = [scale * (a + b) for a, b in halves]
    fit = fit_returned_loss(losses, [list(pair) for pair in halves])
    assert fit.consistent and fit.scale == pytest.approx(scale, rel=1e-9)


@given(st.lists(st.tuples(cross_entropy, cross_entropy), min_size=4, max_size=12,
                unique_by=lambda pair: round(pair[0] / pair[1], 2)),
       st.sampled_from([(1.0, -1.0), (1.0, 0.0), (0.0, 1.0), (1.0, 0.3)]))
def test_halves_weighted_apart_are_found_with_their_weights(halves, weights):
    losses = [weights[0] * a + weights[1] * b for a, b in halves]
    fit = fit_returned_loss(losses, [list(pair) for pair in halves])
    assert not fit.consistent and fit.first_off is not None
    assert fit.weights == pytest.approx(weights, abs=2e-3)
    assert fit.loss_off == losses[fit.first_off]


def test_the_first_step_off_and_the_scale_before_it_are_reported():
    parts = [[1.0, 2.0], [2.0, 2.0], [0.5, 3.0], [1.0, 1.0]]
    losses = [3.0, 4.0, -2.5, 2.0]  # the third step subtracts
    fit = fit_returned_loss(losses, parts)
    assert (fit.consistent, fit.first_off, fit.scale_before) == (False, 2, 1.0)
    assert fit.parts_off == (0.5, 3.0)


def test_one_pair_asks_for_a_scale_of_its_own_cross_entropy():
    assert fit_returned_loss([0.2, 0.4], [[1.0], [2.0]]).scale == pytest.approx(0.2)
    assert not fit_returned_loss([0.2, 0.2], [[1.0], [2.0]]).consistent
    assert not fit_returned_loss([-1.0, -2.0], [[1.0], [2.0]]).consistent  # c < 0
