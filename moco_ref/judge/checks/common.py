"""Helpers that read one style's evidence for checks of more than one invariant."""

from __future__ import annotations

import math

from moco_ref.core.contrastive import contrastive_logits
from moco_ref.judge.assertions import (
    SubmissionError,
    at_step,
    fmt_ids,
    require,
)
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.evidence import ComponentsEvidence, LabEvidence
from moco_ref.judge.invariants import (
    fifo_contents,
    form_gradient,
    gradient_error,
)


def judgeable_loss(ev: LabEvidence, what: str):
    fit = ev.loss
    if not fit.all_match:
        bad = next(i for i, ok in enumerate(fit.matched) if not ok)
        raise SubmissionError(
            f"cannot judge {what}: the loss could not be recomputed from the recorded q, k and "
            f"queue ({ev.step_where(bad)} differs from every known form; see "
            "I8-loss-matches-recomputation)")
    return fit


def loss_form_error(ev: LabEvidence, form, t: int, temperature: float | None = None) -> float:
    result = form_gradient(form, ev.loss_inputs[t], temperature or ev.options.temperature)
    return math.inf if result is None else gradient_error(ev.steps[t].grad, result[1])


def evidence_step(ev: LabEvidence, fit, alternative, predicate=lambda t: True) -> int:
    """The first step where ``alternative`` is told apart from the identified form."""
    for t in range(len(ev.steps)):
        if predicate(t) and loss_form_error(ev, alternative, t, fit.temperature) > fit.tolerance:
            return t
    return 0


def gradient_evidence(ev: LabEvidence, fit, alternative, t: int) -> str:
    return (f"(dL/dq matches it to {fit.errors[t]:.1e}; the expected form is off by "
            f"{loss_form_error(ev, alternative, t, fit.temperature):.1e})")


def builder_where(step: int, after: bool = False) -> str:
    return at_step(step, after=after)


def pointer_text(step) -> str:
    return f"queue_ptr {step.ptr_before} → {step.ptr_after}"


def judgeable_logits(ev: BuilderEvidence, what: str):
    fit = ev.logits
    if not fit.all_match:
        bad = next(i for i, ok in enumerate(fit.matched) if not ok)
        raise SubmissionError(
            f"cannot judge {what}: the logits could not be recomputed from the recorded q, k and "
            f"queue ({builder_where(bad)} differs from every known form; see "
            "I8-loss-matches-recomputation)")
    return fit






def case_where(number: int, case, enqueue: int | None = None) -> str:
    text = f"in case {number} (capacity {case.capacity}, batches {list(case.batch_sizes)})"
    if enqueue is not None:
        text += f" after enqueue {enqueue}"
    return text


def queue_runs(ev: ComponentsEvidence):
    """``(number, case, enqueue index, expected arrivals, got arrivals, stored keys, stored
    ids, len)`` after every enqueue of every queue case."""
    for number, case, output in ev.outputs("queue"):
        expected = fifo_contents(case.arrivals(), case.capacity)
        for e, want in enumerate(expected):
            keys, ids = output["keys"][e], output["ids"][e]
            yield number, case, e, want, case.arrivals_of(keys), keys, ids, output["len"][e]


def logits_runs(ev: ComponentsEvidence):
    for number, case, output in ev.outputs("logits"):
        t = case.tensors()
        reference = contrastive_logits(t["q"], t["k"], t["queue_keys"], t["queue_ids"], t["ids"],
                                       case.temperature)
        got = output["logits"]
        where = (f"in case {number} (B = {case.batch}, queue {case.queue_len}, "
                 f"T = {case.temperature:g}, ids {fmt_ids(t['ids'])}, queue ids "
                 f"{fmt_ids(t['queue_ids'])})")
        require(got.shape == reference.shape, "contrastive_logits must return [B, 1 + n]",
                where=where, expected=f"shape {list(reference.shape)}",
                got=f"shape {list(got.shape)}")
        yield number, case, t, reference, got, where
