"""I9: the current batch's keys are not its own negatives (enqueue after the loss)."""

from __future__ import annotations

from dataclasses import replace

from moco_ref.judge.assertions import (
    at_step,
    fail,
)
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.checks.common import (
    builder_where,
    evidence_step,
    gradient_evidence,
    judgeable_logits,
    judgeable_loss,
    pointer_text,
)
from moco_ref.judge.evidence import LabEvidence
from moco_ref.judge.registry import check

BATCH_NOT_OWN_NEGATIVE = check(
    "I9-batch-not-own-negative",
    "the current batch's keys are not its negatives",
    points=2,
    contract=(
        "The current batch's keys are not negatives of the current batch: the enqueue happens "
        "after the loss."
    ),
)


@BATCH_NOT_OWN_NEGATIVE.judges('lab')
def i9_batch_not_own_negative_lab(ev: LabEvidence) -> str | None:
    """The loss of a batch uses the queue as it was *before* the batch: its keys are enqueued
    after the loss, so they are never negatives for their own batch."""
    fit = judgeable_loss(ev, "which keys were negatives")
    if fit.form.negatives != "after":
        return None
    expected_form = replace(fit.form, negatives="before")
    t = evidence_step(ev, fit, expected_form, lambda s: s > 0)
    before = len(ev.loss_inputs[t].negatives["before"][1])
    fail("the batch's own keys were negatives (enqueued before the loss)",
         where=at_step(t, ev.steps[t].ids),
         expected=f"negatives from the queue before this batch ({before} keys)",
         got=f"the queue after enqueueing this batch's {len(ev.steps[t].ids)} keys "
             + gradient_evidence(ev, fit, expected_form, t))


@BATCH_NOT_OWN_NEGATIVE.judges('builder')
def i9_batch_not_own_negative_builder(ev: BuilderEvidence) -> str | None:
    """The logits of a step use the queue as it was *before* the step: the batch's keys are
    enqueued after the logits, so they are never negatives of their own batch."""
    fit = judgeable_logits(ev, "which keys were negatives")
    if fit.form.negatives == "before":
        return None
    step = ev.steps[0]
    fail("the batch's own keys were negatives (enqueued before the logits were computed)",
         where=builder_where(0),
         expected=f"negatives from the queue before the step ({pointer_text(step)})",
         got=f"the queue after enqueueing this batch's {ev.probe.batch} keys: each query's "
             "positive q·k⁺/T appears again among its negatives")
