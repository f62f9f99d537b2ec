"""I4: same-source negatives are masked; the positive and other sources never are."""

from __future__ import annotations

import torch

from moco_ref.core.contrastive import same_source_mask
from moco_ref.judge.assertions import (
    NotExercised,
    NotJudged,
    fail,
)
from moco_ref.judge.checks.common import (
    NEEDS_LOSS,
    factor_fault,
    fail_factor,
    judgeable_loss_note,
    logits_runs,
    loss_steps,
    steps_text,
)
from moco_ref.judge.components_evidence import ComponentsEvidence
from moco_ref.judge.invariants import (
    form_logits,
)
from moco_ref.judge.invariants.logits import masked_columns
from moco_ref.judge.invariants.loss import normalized_pair
from moco_ref.judge.lab_evidence import LabEvidence
from moco_ref.judge.registry import check


def _same_source_mass(ev: LabEvidence, form, temperature: float, t: int) -> float:
    """The mean probability the step's loss puts on a query's same-source negatives."""
    step = ev.loss_inputs[t]
    keys, ids = step.negatives[form.negatives]
    q, k = normalized_pair(form, step.z.to(torch.float64), step.k.to(torch.float64))
    logits, _ = form_logits(form, q, k, keys, ids, step.ids, temperature)
    if logits.shape[1] != 1 + len(ids):
        return 0.0
    p = logits.softmax(dim=1)[:, 1:]  # [B, n]
    same = same_source_mask(step.ids, ids)  # [B, n]
    rows = same.any(dim=1)
    return float((p * same).sum(dim=1)[rows].mean()) if rows.any() else 0.0


def _mask_picture(ev: LabEvidence, t: int, rule: str, rows: int = 8, columns: int = 50) -> dict:
    """The same-source columns of (at most ``rows``) queries at step t, for the feedback's
    figure: which queue columns the mask should hide, and the rule the submission used."""
    step = ev.loss_inputs[t]
    _, ids = step.negatives["before"]
    same = same_source_mask(step.ids, ids)  # [B, n]
    chosen = [int(i) for i in same.any(dim=1).nonzero().flatten()[:rows]]
    return {"mask_step": t, "mask_negatives": len(ids), "mask_rule": rule,
            "mask_rows": chosen,
            "mask_expected": [[int(j) for j in same[i].nonzero().flatten()[:columns]]
                              for i in chosen]}


def _mask_grid(want: torch.Tensor, have: torch.Tensor, rows: int = 16,
               columns: int = 64) -> dict:
    """The masked negative columns expected and got (at most ``rows`` × ``columns``)."""
    return {"mask_grid_expected": want[:rows, :columns].int().tolist(),
            "mask_grid_got": have[:rows, :columns].int().tolist()}


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
    with −inf or a large negative number, not 0); entries of other sources are never masked
    (the mask compares ids with ``==``). Judged at every step whose loss uses the queue."""
    diagnosis, steps = loss_steps(
        ev, "the same-source mask", lambda t: len(ev.loss_inputs[t].negatives["before"][1]) > 0)
    fault = factor_fault(diagnosis, steps, "mask", ("none", "fill-zero", "inverted", "rows-zero"))
    if fault:
        t, _, form = fault
        rule = form.mask
        if rule == "rows-zero":
            step = ev.loss_inputs[t]
            _, queued = step.negatives[form.negatives]
            zeroed = int(same_source_mask(step.ids, queued).any(dim=0).sum())
            mass = _same_source_mass(ev, form, diagnosis.temperature, t)
            fail_factor(ev, diagnosis, fault, "mask",
                        "the mask zeroes the queue rows of the batch's images instead of "
                        "masking their logits: a zero row's logit is 0 for every query, and "
                        "e^0 still counts in the softmax",
                        expected=f"probability 0 for the {ev.collisions(t)} negatives from a "
                                 "query's own image, the other queries' logits untouched",
                        got=f"{zeroed} queue rows zeroed (logit 0 for all {len(step.ids)} "
                            f"queries); {mass:.3g} of each such query's probability on its "
                            "own image's entries, on average",
                        details=_mask_picture(ev, t, rule))
        if rule == "inverted":
            fail_factor(ev, diagnosis, fault, "mask",
                        "the mask is inverted: it hides every negative from another image and "
                        "keeps the same-source ones (ids compared with != instead of ==)",
                        expected=f"only the {ev.collisions(t)} same-source negatives masked",
                        got="all other-source negatives masked",
                        details=_mask_picture(ev, t, rule))
        mass = _same_source_mass(ev, form, diagnosis.temperature, t)
        fail_factor(ev, diagnosis, fault, "mask",
                    "same-source negatives were not masked" if rule == "none" else
                    "same-source logits were set to 0, not −∞: e^0 still counts in the softmax",
                    expected=f"probability 0 for the {ev.collisions(t)} negatives from a "
                             "query's own image",
                    got=f"{mass:.3g} of each such query's probability on them, on average",
                    details=_mask_picture(ev, t, rule))
    if not any(ev.collisions(t) for t in steps):
        unexplained = [t for t in range(len(ev.steps)) if t not in steps and ev.collisions(t)]
        if unexplained:  # the pairs were there, at steps whose loss no form explains
            raise NotJudged(NEEDS_LOSS, f"queries met queued keys of their own image only at "
                                        f"{steps_text(unexplained)}, whose loss the grader "
                                        "cannot recompute: the mask cannot be read there")
        raise NotExercised("not judged: no query met a queued key of its own image")
    pairs = sum(ev.collisions(t) for t in steps)
    return judgeable_loss_note(diagnosis, steps, len(ev.steps)) or (
        f"{pairs} same-source pairs masked")


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
                 got=f"{float(got[i, j + 1]):.4g}", details=_mask_grid(want, have))
        if extra.any():
            i, j = (int(v) for v in extra.nonzero()[0])
            fail("negatives of other sources were masked", where=where,
                 expected=f"logit [{i}, {j + 1}] = {float(reference[i, j + 1]):.4g}",
                 got=f"{float(got[i, j + 1]):.4g}", details=_mask_grid(want, have))
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
    diagnosis, steps = loss_steps(
        ev, "the positive", lambda t: len(ev.loss_inputs[t].negatives["before"][1]) > 0)
    fault = factor_fault(diagnosis, steps, "mask", ("positive-too",))
    if fault:
        fail_factor(ev, diagnosis, fault, "mask",
                    "the positive was masked along with the same-source negatives (its id "
                    "equals the query's)",
                    expected="the positive logit q·k⁺/T in column 0",
                    got="column 0 masked: the loss is −ln 0 up to the mask constant and the "
                        "gradient reaches q only through the negatives")
    return judgeable_loss_note(diagnosis, steps, len(ev.steps))


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
