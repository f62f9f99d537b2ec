"""I9: the current batch's keys are not its own negatives (enqueue after the loss)."""

from __future__ import annotations

from moco_ref.judge.assertions import (
    fail,
)
from moco_ref.judge.builder_evidence import SYMMETRIC, VIEW_NAMES, BuilderEvidence
from moco_ref.judge.checks.common import (
    builder_where,
    factor_fault,
    fail_factor,
    judgeable_logits,
    judgeable_loss_note,
    loss_steps,
    pointer_text,
)
from moco_ref.judge.lab_evidence import LabEvidence
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
    diagnosis, steps = loss_steps(ev, "which keys were negatives")
    fault = factor_fault(diagnosis, steps, "negatives", ("after", "with-current"))
    if fault:
        t = fault[0]
        before = len(ev.loss_inputs[t].negatives["before"][1])
        got = ("the queue after enqueueing this batch's {n} keys" if fault[2].negatives == "after"
               else "the queue with this batch's {n} keys appended")
        fail_factor(ev, diagnosis, fault, "negatives",
                    "the batch's own keys were negatives (they must join the queue only after "
                    "the loss)",
                    expected=f"negatives from the queue before this batch ({before} keys)",
                    got=got.format(n=len(ev.steps[t].ids)))
    return judgeable_loss_note(diagnosis, steps, len(ev.steps))


@BATCH_NOT_OWN_NEGATIVE.judges('builder')
def i9_batch_not_own_negative_builder(ev: BuilderEvidence) -> str | None:
    """The logits of a step use the queue as it was *before* the step: the batch's keys are
    enqueued after the logits, so they are never negatives of their own batch."""
    fit = judgeable_logits(ev, "which keys were negatives")
    if fit.form.negatives == "before":
        return None
    step = ev.steps[0]
    if ev.variant == SYMMETRIC and ev.pollution.get(step.index) == "both halves":
        fail("the step's keys were negatives of both halves (both views' keys enqueued before "
             "the losses; enqueue them after both)", where=ev.logit_where(0),
             expected=f"negatives from the queue before the step ({pointer_text(step)}), for "
                      "both halves",
             got=f"the queue after enqueueing this step's {ev.probe.batch} keys: each query "
                 "meets its own positive (and its image's other key) among its negatives")
    if ev.variant == SYMMETRIC:
        (_, first_keys, _), (second_queries, _, _) = step.halves
        fail("queue pollution: the first half's keys were negatives of the second half (they "
             "were enqueued between the two halves; enqueue both views' keys after both "
             "losses)", where=ev.logit_where(1),
             expected=f"negatives from the queue before the step ({pointer_text(step)}), for "
                      "both halves",
             got=f"the queue with the {ev.view_batch} keys of {VIEW_NAMES[first_keys]} "
                 f"already enqueued: each query of {VIEW_NAMES[second_queries]} meets a key "
                 "of its own image among its negatives")
    fail("the batch's own keys were negatives (enqueued before the logits were computed)",
         where=builder_where(0),
         expected=f"negatives from the queue before the step ({pointer_text(step)})",
         got=f"the queue after enqueueing this batch's {ev.probe.batch} keys: each query's "
             "positive q·k⁺/T appears again among its negatives")
