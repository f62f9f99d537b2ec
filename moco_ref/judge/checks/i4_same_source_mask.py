"""I4: same-source negatives are masked; the positive and other sources never are."""

from __future__ import annotations

from dataclasses import replace

import torch

from moco_ref.core.contrastive import same_source_mask
from moco_ref.judge.assertions import (
    NotExercised,
    at_step,
    fail,
)
from moco_ref.judge.checks.common import (
    evidence_step,
    gradient_evidence,
    judgeable_loss,
    logits_runs,
)
from moco_ref.judge.evidence import ComponentsEvidence, LabEvidence
from moco_ref.judge.invariants import (
    form_logits,
)
from moco_ref.judge.invariants.logits import masked_columns
from moco_ref.judge.registry import check


def _same_source_mass(ev: LabEvidence, fit, t: int) -> float:
    step = ev.loss_inputs[t]
    keys, ids = step.negatives[fit.form.negatives]
    q, k = step.z.to(torch.float64), step.k.to(torch.float64)
    if fit.form.normalize != "q-raw":
        q = torch.nn.functional.normalize(q, dim=1)
    if fit.form.normalize != "k-raw":
        k = torch.nn.functional.normalize(k, dim=1)
    logits, _ = form_logits(fit.form, q, k, keys, ids, step.ids, fit.temperature)
    p = logits.softmax(dim=1)[:, 1:]  # [B, n]
    same = same_source_mask(step.ids, ids)  # [B, n]
    rows = same.any(dim=1)
    return float((p * same).sum(dim=1)[rows].mean()) if rows.any() else 0.0


SAME_SOURCE_MASKED = check(
    "I4-same-source-masked",
    "negatives from the query's own image are masked",
    points=2,
    contract=(
        "A negative whose source id equals the query's id contributes nothing to the softmax: "
        "its probability is exactly 0."
    ),
)


@SAME_SOURCE_MASKED.judges('lab')
def i4_same_source_masked_lab(ev: LabEvidence) -> str | None:
    """A queue entry whose source id equals the query's id gets probability exactly 0 (masked
    with −inf or a large negative number); entries of other sources are never masked."""
    fit = judgeable_loss(ev, "the same-source mask")
    colliding = [t for t in range(len(ev.steps))
                 if ev.collisions(t, fit.form.negatives if fit.form.negatives != "recomputed"
                                  else "before")]
    if not colliding:
        raise NotExercised("not exercised: no query met a queued key of its own image")
    if fit.form.mask != "none":
        return f"{sum(ev.collisions(t) for t in colliding)} same-source pairs masked"
    expected_form = replace(fit.form, mask="same-source")
    t = evidence_step(ev, fit, expected_form, lambda s: s in colliding)
    mass = _same_source_mass(ev, fit, t)
    fail("same-source negatives were not masked", where=at_step(t, ev.steps[t].ids),
         expected=f"probability 0 for the {ev.collisions(t)} negatives from a query's own image",
         got=f"{mass:.3g} of each such query's probability on them, on average "
             + gradient_evidence(ev, fit, expected_form, t))


@SAME_SOURCE_MASKED.judges('components')
def i4_same_source_masked_components(ev: ComponentsEvidence) -> str | None:
    """``contrastive_logits`` masks (−inf, or a value whose probability is 0) exactly the queue
    entries whose id equals the query's id, and no other negative."""
    for _, _, _, reference, got, where in logits_runs(ev):
        want, have = masked_columns(reference)[:, 1:], masked_columns(got)[:, 1:]
        missing, extra = want & ~have, have & ~want
        if missing.any():
            i, j = (int(v) for v in missing.nonzero()[0])
            fail("same-source negatives were not masked", where=where,
                 expected=f"logit [{i}, {j + 1}] masked (same id)",
                 got=f"{float(got[i, j + 1]):.4g}")
        if extra.any():
            i, j = (int(v) for v in extra.nonzero()[0])
            fail("negatives of other sources were masked", where=where,
                 expected=f"logit [{i}, {j + 1}] = {float(reference[i, j + 1]):.4g}",
                 got=f"{float(got[i, j + 1]):.4g}")
    return None


POSITIVE_NEVER_MASKED = check(
    "I4-positive-never-masked",
    "the positive is never masked",
    points=1,
    contract=(
        "The positive (column 0) is never masked, and negatives from other sources are never "
        "masked."
    ),
)


@POSITIVE_NEVER_MASKED.judges('lab')
def i4_positive_never_masked_lab(ev: LabEvidence) -> str | None:
    """Column 0, the positive ``q·k⁺/T``, is never masked, even though k⁺ comes from the
    query's own image."""
    fit = judgeable_loss(ev, "the positive")
    if fit.form.mask != "positive-too":
        return None
    expected_form = replace(fit.form, mask="same-source")
    t = evidence_step(ev, fit, expected_form, lambda s: len(ev.loss_inputs[s].negatives[
        fit.form.negatives][1]) > 0)
    fail("the positive was masked along with the same-source negatives (its id equals the "
         "query's)", where=at_step(t, ev.steps[t].ids),
         expected="the positive logit q·k⁺/T in column 0",
         got="column 0 masked: the loss is −ln 0 up to the mask constant and the gradient "
             "reaches q only through the negatives "
             + gradient_evidence(ev, fit, expected_form, t))


@POSITIVE_NEVER_MASKED.judges('components')
def i4_positive_never_masked_components(ev: ComponentsEvidence) -> str | None:
    """Column 0 of ``contrastive_logits`` (the positive) is never masked."""
    for _, _, _, reference, got, where in logits_runs(ev):
        masked = masked_columns(got)[:, 0]
        if masked.any():
            i = int(masked.nonzero()[0])
            fail("the positive was masked", where=where,
                 expected=f"logit [{i}, 0] = {float(reference[i, 0]):.4g}",
                 got=f"{float(got[i, 0]):.4g}")
    return None
