"""Helpers that read one style's evidence for checks of more than one invariant."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NoReturn

from moco_ref.core.contrastive import contrastive_logits
from moco_ref.judge.assertions import (
    NotJudged,
    SubmissionError,
    at_step,
    fail,
    fmt_ids,
    require,
)
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.components_evidence import ComponentsEvidence
from moco_ref.judge.invariants import (
    REFERENCE_FORM,
    fifo_contents,
    form_gradient,
    gradient_error,
)
from moco_ref.judge.invariants.loss_diagnosis import LossDiagnosis
from moco_ref.judge.lab_evidence import LOSS_CHECK as NEEDS_LOSS
from moco_ref.judge.lab_evidence import LabEvidence

MAX_SERIES = 200  # per-step numbers a failure's details carry for the feedback's figures


def _rounded(value) -> float | None:
    return None if value is None else float(f"{float(value):.6g}")


def loss_series(ev: LabEvidence, diagnosis: LossDiagnosis) -> dict:
    """The reference loss and the submission's (recomputed under the form that explains its
    gradient; None where none does) at each of the first ``MAX_SERIES`` steps."""
    reference, submission = [], []
    for t in range(min(len(ev.steps), len(diagnosis.steps), MAX_SERIES)):
        result = form_gradient(REFERENCE_FORM, ev.loss_inputs[t], diagnosis.temperature)
        reference.append(None if result is None else _rounded(result[0]))
        submission.append(_rounded(diagnosis.steps[t].loss))
    return {"loss_reference": reference, "loss_submission": submission}


def steps_text(steps: list[int]) -> str:
    """``step 4``, ``steps 4–11`` or ``steps 1–3, 7`` (runs of consecutive steps)."""
    runs: list[list[int]] = []
    for t in steps:
        if runs and runs[-1][-1] == t - 1:
            runs[-1].append(t)
        else:
            runs.append([t])
    shown = ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs[:4])
    more = f", … ({len(steps)} in all)" if len(runs) > 4 else ""
    return f"step{'s' if len(steps) > 1 else ''} {shown}{more}"


def loss_steps(ev: LabEvidence, what: str, relevant=None) -> tuple[LossDiagnosis, list[int]]:
    """The diagnosis, and the steps (of those ``relevant(t)`` selects) whose loss the grader
    could explain; ``NotJudged`` when there are relevant steps and it could explain none."""
    diagnosis = ev.loss_diagnosis
    chosen = [t for t in range(len(ev.steps)) if relevant is None or relevant(t)]
    explained = [t for t in chosen if diagnosis.form_at(t) is not None]
    if chosen and not explained:
        raise NotJudged(NEEDS_LOSS, f"{what} cannot be read from a loss the grader cannot "
                                    f"recompute, at {steps_text(chosen)}")
    return diagnosis, explained


def factor_fault(diagnosis: LossDiagnosis, steps: list[int], factor: str, bad: tuple[str, ...]):
    """``(first step, every such step, its form)`` of the given steps whose loss has
    ``factor`` in ``bad``, or None."""
    faulty = diagnosis.steps_where(factor, bad, steps)
    if not faulty:
        return None
    return faulty[0], faulty, diagnosis.form_at(faulty[0])


def fault_where(ev: LabEvidence, faulty: list[int]) -> str:
    """``at steps 4–11 (first: step 4 (epoch 0, ids […]), the queue holding 240 keys)``."""
    t = faulty[0]
    return f"at {steps_text(faulty)} (first: {ev.step_where(t)}, {ev.queue_context(t)})"


def loss_form_error(ev: LabEvidence, form, t: int, temperature: float | None = None) -> float:
    result = form_gradient(form, ev.loss_inputs[t], temperature or ev.options.temperature)
    return math.inf if result is None else gradient_error(ev.steps[t].grad, result[1])


def gradient_evidence(ev: LabEvidence, diagnosis: LossDiagnosis, alternative, t: int) -> str:
    return (f"(dL/dq matches it to {diagnosis.steps[t].error:.1e}; the expected form is off by "
            f"{loss_form_error(ev, alternative, t, diagnosis.temperature):.1e})")


def fail_factor(ev: LabEvidence, diagnosis: LossDiagnosis, fault, factor: str,
                misconception: str, *, expected: str, got: str,
                details: dict | None = None) -> NoReturn:
    """Fail with the steps whose loss has the faulty ``factor``, the gradient evidence at the
    first of them, and, when the loss changes over the run, which steps computed what
    (``details``: more evidence for the feedback's figures)."""
    t, faulty, form = fault
    expected_form = replace(form, **{factor: getattr(REFERENCE_FORM, factor)})
    got = f"{got} {gradient_evidence(ev, diagnosis, expected_form, t)}"
    if len(diagnosis.runs()) > 1:
        got += f"; over the run, {diagnosis.narrative(ev.queue_context)}"
    fail(misconception, where=fault_where(ev, faulty), expected=expected, got=got,
         details={"steps": faulty, "loss_by_step": diagnosis.narrative(ev.queue_context, 12),
                  "loss_story": diagnosis.story(ev.queue_context),
                  **loss_series(ev, diagnosis), **(details or {})})


def judgeable_loss_note(diagnosis: LossDiagnosis, steps: list[int], total: int) -> str | None:
    """Said on a pass judged on fewer steps than the run has."""
    if len(steps) == total:
        return None
    return (f"judged on the {len(steps)} steps whose loss the grader could explain "
            f"(see {NEEDS_LOSS})")


def builder_where(step: int, after: bool = False) -> str:
    return at_step(step, after=after)


def pointer_text(step) -> str:
    return f"queue_ptr {step.ptr_before} → {step.ptr_after}"


def judgeable_logits(ev: BuilderEvidence, what: str):
    fit = ev.judged_logits
    if not fit.all_match:
        bad = next(i for i, ok in enumerate(fit.matched) if not ok)
        raise SubmissionError(
            f"cannot judge {what}: the logits could not be recomputed from the recorded q, k and "
            f"queue ({ev.logit_where(bad)} differs from every known form; see "
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
