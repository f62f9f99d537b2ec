"""The parametric loss families (issue 29.1): each is fitted with its value, and the fit
does not invent one where the reference explains every step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moco_ref.judge.invariants import REFERENCE_FORM, identify_loss_form
from moco_ref.judge.invariants.loss import LossForm
from moco_ref.judge.invariants.loss_diagnosis import diagnose_loss
from tests.judge.test_conformance_invariants import _observed, _step

pytestmark = pytest.mark.full  # the second tier (grades in-process or starts the sandbox per case)

def _run(seed: int, queued: int = 4):
    return [_step(seed, first=True)] + [_step(seed + i) for i in range(1, queued)]


@pytest.mark.parametrize(("form", "named"), [
    (replace(REFERENCE_FORM, queue_t=0.07), "divided by 0.07"),
    (replace(REFERENCE_FORM, warmup_t=0.4), "divided by 0.4"),
    (replace(REFERENCE_FORM, scale=0.25), "divided by 4"),
    (replace(REFERENCE_FORM, newest=5), "newest 5 queued keys"),
    (replace(REFERENCE_FORM, labels="arange"), "arange(B)"),
    (replace(REFERENCE_FORM, labels="last"), "last column"),
    (replace(REFERENCE_FORM, smoothing=0.15), "label_smoothing=0.15"),
], ids=["queue-T", "warmup-T", "scale", "newest", "labels-arange", "labels-last", "smoothing"])
def test_each_family_is_fitted_with_its_value(form: LossForm, named: str):
    steps = _observed(form, _run(70))
    fit = identify_loss_form(steps, 0.2)
    assert fit.all_match
    assert fit.form == form
    assert named in fit.form.describe()
    assert not fit.temperature_fitted


def test_a_branch_temperature_is_charged_only_where_its_branch_runs():
    steps = _observed(replace(REFERENCE_FORM, queue_t=0.07), _run(80))
    diagnosis = diagnose_loss(steps, identify_loss_form(steps, 0.2))
    assert diagnosis.form_at(0) == REFERENCE_FORM  # the empty-queue step: in-batch, at T
    assert all(diagnosis.form_at(t).queue_t == 0.07 for t in (1, 2, 3))


def test_no_parameter_is_fitted_to_the_reference():
    fit = identify_loss_form(_observed(REFERENCE_FORM, _run(90)), 0.2)
    assert fit.form == REFERENCE_FORM


@pytest.mark.parametrize("epsilon", [0.1, 0.2])
def test_label_smoothing_is_read_off_torch_s_own_loss(epsilon):
    """The bundled examples train with PyTorch's own ``label_smoothing`` (not the grader's
    formula): the report names the ε they were written with."""
    from moco_ref.judge.results import Status
    from tests.helpers.conformance_support import SUBMISSIONS, grade, load_namespace

    name = {0.1: "bug_loss_label_smoothing.py", 0.2: "bug_loss_label_smoothing_module.py"}
    results, _ = grade(load_namespace(SUBMISSIONS / name[epsilon]), "lab")
    loss = next(r for r in results if r.check_id == "I8-loss-matches-recomputation")
    assert loss.status is Status.FAILED
    assert loss.message.startswith(f"the loss is cross_entropy with label_smoothing={epsilon:g}:")
