"""Unit tests of the invariant functions the harness judges with (``conformance.invariants``).

Each function is tested both ways: it accepts what the invariant allows and it rejects — or
names — what a known mistake produces."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from moco_ref.judge.invariants import (
    REFERENCE_FORM,
    KeyUpdate,
    StepLossInputs,
    analyse_key_updates,
    arrival_numbers,
    ema_prediction,
    fifo_contents,
    fit_momentum,
    fits_ema,
    form_gradient,
    gradient_error,
    identify_loss_form,
    identify_queue_rule,
    match_rows,
    queue_contents,
    rotation_of,
    through_one_buffer,
)
from moco_ref.judge.invariants.loss import FORM_CHOICES
from moco_ref.judge.invariants.loss_diagnosis import departure, diagnose_loss

# =========================================================================== fifo (I2, I3)

batch_size_lists = st.lists(st.integers(1, 9), min_size=1, max_size=7)


@given(batch_size_lists, st.integers(1, 12))
def test_fifo_contents_are_the_last_capacity_arrivals(sizes, capacity):
    batches = arrival_numbers(sizes)
    for i, held in enumerate(fifo_contents(batches, capacity)):
        everything = torch.cat(batches[: i + 1])
        assert torch.equal(held, everything[-capacity:])


def test_fifo_contents_wrap_in_the_middle_of_a_batch():
    held = fifo_contents(arrival_numbers([3, 3]), 4)
    assert held[-1].tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize("rule", ["fifo", "keeps-oldest", "newest-first"])
def test_identify_queue_rule_names_each_rule(rule):
    batches = arrival_numbers([60, 60, 30, 60, 60, 30])
    final = queue_contents(rule, batches, 240)[-1]
    assert identify_queue_rule(final, batches, 240) == rule


def test_identify_queue_rule_rejects_anything_else():
    batches = arrival_numbers([3, 3, 3])
    assert identify_queue_rule(torch.tensor([5, 4, 8, 7]), batches, 4) is None


def test_rules_differ_once_the_queue_wraps():
    batches = arrival_numbers([3, 3])
    finals = {rule: queue_contents(rule, batches, 4)[-1].tolist()
              for rule in ("fifo", "keeps-oldest", "newest-first")}
    assert finals == {"fifo": [2, 3, 4, 5], "keeps-oldest": [0, 1, 2, 3],
                      "newest-first": [3, 4, 5, 0]}


@given(st.lists(st.integers(1, 6), min_size=1, max_size=7), st.integers(1, 12))
def test_through_one_buffer_is_what_views_of_one_reused_tensor_show(sizes, capacity):
    # independent derivation: real views of one buffer, written with copy_ batch by batch
    batches = arrival_numbers(sizes)
    buffer = torch.full((max(sizes), 1), -1, dtype=torch.int64)
    views, labels = [], []
    for batch in batches:
        part = buffer[: len(batch)]
        part.copy_(batch[:, None])
        views, labels = (views + [part])[-capacity:], (labels + [batch])[-capacity:]
    held_views = torch.cat(views)[:, 0]
    slots = torch.cat(labels)
    assert torch.equal(through_one_buffer(slots, batches, len(batches)), held_views)


def test_through_one_buffer_shows_the_newest_batch_with_each_row():
    batches = arrival_numbers([3, 3, 2])  # [0 1 2] [3 4 5] [6 7]
    shown = through_one_buffer(torch.tensor([0, 1, 2, 3, 4, 5]), batches, 3)
    assert shown.tolist() == [6, 7, 5, 6, 7, 5]
    assert through_one_buffer(torch.tensor([0, 1, 2]), batches, 1).tolist() == [0, 1, 2]


def test_rotation_of_finds_a_ring_buffer_in_storage_order():
    expected = torch.arange(6)
    assert rotation_of(expected.roll(2), expected) == 2
    assert rotation_of(expected, expected) is None
    assert rotation_of(expected.flip(0), expected) is None


def test_match_rows_traces_copies_and_rejects_strangers():
    candidates = F.normalize(torch.randn(20, 5, generator=torch.Generator().manual_seed(0)), dim=1)
    rows = torch.cat([candidates[[7, 3]] + 1e-7, torch.ones(1, 5)])
    index, distance = match_rows(rows, candidates, atol=1e-5)
    assert index.tolist() == [7, 3, -1]
    assert distance[2] > 1e-5


# =========================================================================== ema (I6, I7)


def test_ema_prediction_is_the_reference_update():
    before, target = torch.tensor([0.0, 2.0]), torch.tensor([2.0, 4.0])
    assert torch.allclose(ema_prediction(before, target, 0.9), torch.tensor([0.2, 2.2],
                                                                            dtype=torch.float64))


@given(st.floats(0.0, 0.999), st.integers(0, 1000))
def test_fit_momentum_recovers_m(m, seed):
    g = torch.Generator().manual_seed(seed)
    triples = []
    for _ in range(3):
        before, target = torch.randn(50, generator=g, dtype=torch.float64), torch.randn(
            50, generator=g, dtype=torch.float64)
        triples.append((m * before + (1 - m) * target, before, target))
    assert fit_momentum(triples) == pytest.approx(m, abs=1e-9)


def test_fit_momentum_is_none_without_information():
    x = torch.ones(4)
    assert fit_momentum([(x, x, x)]) is None


def test_fits_ema_accepts_the_law_and_rejects_another_target():
    g = torch.Generator().manual_seed(1)
    before, target, other = (torch.randn(100, generator=g) for _ in range(3))
    after = ema_prediction(before, target, 0.95).to(torch.float32)
    assert fits_ema(after, before, target, 0.95)[0]
    assert not fits_ema(after, before, other, 0.95)[0]
    assert not fits_ema(after, before, target, 0.5)[0]


def _trajectory(order: str, m: float = 0.9, steps: int = 6, skip: slice | None = None,
                push: float = 0.0):
    """Key updates of a synthetic run: θq takes random steps; θk follows by ``order``."""
    g = torch.Generator().manual_seed(3)
    theta_q = torch.randn(40, generator=g, dtype=torch.float64)
    theta_k = theta_q.clone()
    key_at, query_at, between = [], [], []

    def ema(target):
        nonlocal theta_k
        moved = m * theta_k + (1 - m) * target
        if skip is not None:
            moved[skip] = theta_k[skip]
        theta_k = moved

    for _ in range(steps):
        if order == "lab":
            ema(theta_q)
        key_at.append(theta_k.clone())
        query_at.append(theta_q.clone())
        stale_q = theta_q.clone()
        theta_q = theta_q + 0.05 * torch.randn(40, generator=g, dtype=torch.float64)
        theta_k = theta_k + push * torch.randn(40, generator=g, dtype=torch.float64)
        between.append(theta_k.clone())
        if order == "paper":
            ema(theta_q)
        elif order == "stale":
            ema(stale_q)
    updates = [KeyUpdate(t, key_at[t - 1], between[t - 1] if push else key_at[t - 1],
                         key_at[t], query_at[t], query_at[t - 1]) for t in range(1, steps)]
    updates.append(KeyUpdate(steps, key_at[-1], between[-1] if push else key_at[-1],
                             theta_k.clone(), theta_q.clone(), query_at[-1], final=True))
    return updates


SEGMENTS = [("encoder.weight", slice(0, 30)), ("projector.weight", slice(30, 40))]


@pytest.mark.parametrize("order", ["lab", "paper"])
def test_valid_orders_use_the_current_query_and_are_named(order):
    analysis = analyse_key_updates(_trajectory(order), SEGMENTS)
    assert analysis.uses == "current"
    assert analysis.order == order
    assert analysis.m == pytest.approx(0.9, abs=1e-9)
    assert not analysis.violations


def test_stale_query_is_neither_order():
    analysis = analyse_key_updates(_trajectory("stale"), SEGMENTS)
    assert analysis.uses == "stale"
    assert analysis.order is None


def test_an_ema_that_skips_parameters_is_named():
    analysis = analyse_key_updates(_trajectory("lab", skip=slice(30, 40)), SEGMENTS)
    assert analysis.uses == "current"  # the order is still read off the parameters that moved
    assert any(u.skipped == ["projector.weight"] for u in analysis.violations)


def test_a_key_moved_outside_the_ema_is_named():
    analysis = analyse_key_updates(_trajectory("lab", push=0.01), SEGMENTS)
    assert any(u.moved_outside for u in analysis.violations)


def test_a_frozen_key_encoder_has_m_one():
    updates = _trajectory("lab", m=1.0)
    analysis = analyse_key_updates(updates, SEGMENTS)
    assert analysis.uses == "none" and analysis.m == 1.0


# =========================================================================== loss (I4, I8, I9)


def _step(seed: int, *, first: bool = False, batch: int = 6, queue: int = 10, dim: int = 5,
          recomputed: bool = True) -> StepLossInputs:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(batch, dim, generator=g, dtype=torch.float64)
    k = z + 0.3 * torch.randn(batch, dim, generator=g, dtype=torch.float64)
    # twelve source ids between 1000 and 1033, where bfloat16 rounds some of them alike
    ids = 1000 + 3 * torch.randperm(12, generator=g)[:batch]
    keys = F.normalize(torch.randn(queue, dim, generator=g, dtype=torch.float64), dim=1)
    key_ids = torch.cat([ids[:3], 1000 + 3 * torch.randint(0, 12, (queue - 3,), generator=g)])
    before = (keys[:0], key_ids[:0]) if first else (keys, key_ids)
    current = (torch.cat([before[0], F.normalize(k, dim=1)]), torch.cat([before[1], ids]))
    after = current if first else (current[0][batch:], current[1][batch:])  # capacity = queue
    negatives = {"before": before, "after": after, "with-current": current}
    unfilled = 4  # a preallocated buffer of queue + 4 rows, read whole
    padded = (torch.cat([before[0], keys.new_zeros(unfilled + (queue if first else 0), dim)]),
              torch.cat([before[1], key_ids.new_full((unfilled + (queue if first else 0),), -1)]))
    negatives["zero-initialized"] = padded
    negatives["with-empty-slots"] = before if first else padded
    if recomputed:
        negatives["recomputed"] = (keys[:0], key_ids[:0]) if first else (
            F.normalize(keys + 0.2, dim=1), key_ids)
    return StepLossInputs(z=z, k=k, ids=ids, negatives=negatives)


def _observed(form, steps, temperature=0.2):
    return [replace(s, grad=form_gradient(form, s, temperature)[1]) for s in steps]


def test_reference_form_is_lab07s_loss():
    """The reference form's gradient equals LAB 07's loss written out by hand."""
    step = _step(0)
    z = step.z.clone().requires_grad_(True)
    q, k = F.normalize(z, dim=1), F.normalize(step.k, dim=1)
    keys, key_ids = step.negatives["before"]
    negative = (q @ keys.T).masked_fill(step.ids[:, None] == key_ids[None, :], -1e9)
    logits = torch.cat([(q * k).sum(1, keepdim=True), negative], dim=1) / 0.2
    loss = F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long))
    (expected,) = torch.autograd.grad(loss, z)
    value, grad = form_gradient(REFERENCE_FORM, step, 0.2)
    assert value == pytest.approx(float(loss.detach()))
    assert gradient_error(grad, expected) < 1e-12


def test_reference_form_in_batch_for_an_empty_queue():
    step = _step(1, first=True)
    z = step.z.clone().requires_grad_(True)
    q, k = F.normalize(z, dim=1), F.normalize(step.k, dim=1)
    loss = F.cross_entropy(q @ k.T / 0.2, torch.arange(len(q)))
    (expected,) = torch.autograd.grad(loss, z)
    assert gradient_error(form_gradient(REFERENCE_FORM, step, 0.2)[1], expected) < 1e-12


def test_gradient_error():
    g = torch.ones(3, 2)
    assert gradient_error(g, g) == 0.0
    assert gradient_error(torch.zeros(3, 2), torch.zeros(3, 2)) == 0.0
    assert gradient_error(g, None) == float("inf")
    assert gradient_error(g, 2 * g) == pytest.approx(0.5)


SINGLE_MISTAKES = [(name, choice) for name, choices in FORM_CHOICES.items()
                   for choice in choices[1:]]


@pytest.mark.parametrize(("name", "choice"), SINGLE_MISTAKES,
                         ids=[f"{n}={c}" for n, c in SINGLE_MISTAKES])
def test_identify_loss_form_names_each_single_mistake(name, choice):
    steps = [_step(10, first=True)] + [_step(10 + i) for i in range(1, 4)]
    form = replace(REFERENCE_FORM, **{name: choice})
    fit = identify_loss_form(_observed(form, steps), 0.2)
    assert fit.all_match
    assert fit.form == form
    assert not fit.temperature_fitted


def test_identify_loss_form_keeps_the_reference_when_it_fits():
    steps = [_step(20, first=True)] + [_step(20 + i) for i in range(1, 4)]
    fit = identify_loss_form(_observed(REFERENCE_FORM, steps), 0.2)
    assert fit.form == REFERENCE_FORM and fit.all_match


def test_identify_loss_form_fits_another_temperature():
    steps = [_step(30, first=True)] + [_step(30 + i) for i in range(1, 4)]
    fit = identify_loss_form(_observed(REFERENCE_FORM, steps, temperature=0.07), 0.2)
    assert fit.temperature_fitted and fit.temperature == pytest.approx(0.07, rel=1e-3)


def test_identify_loss_form_admits_an_unknown_loss():
    steps = _observed(REFERENCE_FORM, [_step(40, first=True), _step(41)])
    steps = [replace(s, grad=3.0 * s.grad + 0.01) for s in steps]
    fit = identify_loss_form(steps, 0.2, fit_temperature=False)
    assert not fit.all_match


# --------------------------------------------------------------------------- step by step


def test_diagnosis_explains_a_rule_that_changes_over_the_run():
    """Steps 0–2 computed the reference loss, steps 3–4 no mask: no single form fits, and the
    diagnosis names each run with its own form."""
    steps = [_step(40, first=True)] + [_step(40 + i) for i in range(1, 5)]
    no_mask = replace(REFERENCE_FORM, mask="none")
    observed = _observed(REFERENCE_FORM, steps[:3]) + _observed(no_mask, steps[3:])
    fit = identify_loss_form(observed, 0.2)
    assert not fit.all_match
    diagnosis = diagnose_loss(observed, fit)
    assert diagnosis.all_explained
    assert [(a, b, f.mask) for a, b, f in diagnosis.runs()] == [
        (0, 2, "same-source"), (3, 4, "none")]
    assert diagnosis.steps_where("mask", ("none",)) == [3, 4]
    assert "steps 3–4: no same-source mask" in diagnosis.narrative()


def test_diagnosis_reduces_a_form_to_what_a_step_can_show():
    """Labels of ones change nothing at an empty-queue step (the in-batch branch has its own
    labels): that step is explained by the reference, the others by the labels."""
    steps = [_step(50, first=True)] + [_step(50 + i) for i in range(1, 3)]
    ones = replace(REFERENCE_FORM, labels="ones")
    diagnosis = diagnose_loss(_observed(ones, steps), identify_loss_form(_observed(ones, steps),
                                                                        0.2))
    assert diagnosis.form_at(0) == REFERENCE_FORM
    assert diagnosis.steps_where("labels", ("ones",)) == [1, 2]


def test_diagnosis_leaves_an_unknown_loss_unexplained_and_locates_it():
    """A gradient no candidate explains stays unexplained; the departure names the columns its
    difference lies along (here: only the positive's weight was changed)."""
    step = _step(60)
    value, grad = form_gradient(REFERENCE_FORM, step, 0.2)
    q = F.normalize(step.z, dim=1)
    k = F.normalize(step.k, dim=1)
    tangent = k - (k * q).sum(1, keepdim=True) * q  # along the positive, through normalize
    odd = replace(step, grad=grad + 3.0 * tangent / step.z.norm(dim=1, keepdim=True))
    fit = identify_loss_form([odd], 0.2, fit_temperature=False)
    diagnosis = diagnose_loss([odd], fit)
    assert diagnosis.unexplained == [0]
    assert "the positive" in departure(odd, REFERENCE_FORM, 0.2)
