"""I8: L = −ln p⁺ with the positive at column 0, logits / T, normalized embeddings, and
in-batch negatives while the queue is empty."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from moco_ref.core.contrastive import contrastive_logits, info_nce_loss, positive_labels
from moco_ref.judge.assertions import (
    at_step,
    fail,
    fmt_ids,
    fmt_values,
)
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.checks.common import (
    builder_where,
    evidence_step,
    gradient_evidence,
    judgeable_logits,
    judgeable_loss,
    logits_runs,
    loss_form_error,
)
from moco_ref.judge.evidence import ComponentsEvidence, LabEvidence
from moco_ref.judge.invariants import (
    REFERENCE_FORM,
    describe_logits_form,
    expected_logits,
    form_gradient,
    gradient_error,
    logits_error,
)
from moco_ref.judge.invariants.logits import BUILDER_FORM, masked_columns
from moco_ref.judge.invariants.loss import FORM_TEXT
from moco_ref.judge.registry import check

LOSS_MATCHES_RECOMPUTATION = check(
    "I8-loss-matches-recomputation",
    "the loss is −ln p⁺ as recomputed from q, k and the queue",
    points=2,
    contract=(
        "The loss is L = −ln p⁺, the mean over the batch of the cross-entropy of logits [q·k⁺, "
        "q·queueᵀ] / T with the positive at column 0, as recomputed from the recorded q, k and "
        "queue."
    ),
)


@LOSS_MATCHES_RECOMPUTATION.judges('lab')
def i8_loss_matches_recomputation_lab(ev: LabEvidence) -> str | None:
    """At every step the gradient of the submission's loss w.r.t. the query's projection equals
    that of a recomputed InfoNCE loss (−ln p⁺, mean over the batch) from the recorded q, k,
    the queue rebuilt from recorded keys, the ids and T. (Which ingredient differs from the
    reference is judged by the I4, I8 and I9 checks; this one fails only when no form fits.)"""
    fit = ev.loss
    if fit.all_match:
        return "matches " + fit.form.describe()
    t = next(i for i, ok in enumerate(fit.matched) if not ok)
    step = ev.steps[t]
    if step.grad is None:
        fail("no gradient of the loss reached the query encoder", where=at_step(t, step.ids),
             expected="loss.backward() through q = normalize(query(view)[1])", got="no gradient")
    result = form_gradient(REFERENCE_FORM, ev.loss_inputs[t], ev.options.temperature)
    hint = ""
    if result is not None:
        reference = result[1]
        scale = float((step.grad.to(torch.float64) * reference).sum() / (reference ** 2).sum())
        if abs(scale - len(step.ids)) < 0.01 * len(step.ids):
            hint = " (the loss looks summed over the batch instead of averaged)"
        elif abs(scale - 1) > 0.01 and gradient_error(step.grad, scale * reference) < fit.tolerance:
            hint = f" (the loss is the reference's times {scale:.4g})"
    fail("the loss is not one the grader can recompute" + hint, where=at_step(t, step.ids),
         expected=f"dL/dq of {fit.form.describe()} (T = {fit.temperature:g})",
         got=f"a gradient off by {fit.errors[t]:.2g} of its size (the reference loss: off by "
             f"{loss_form_error(ev, REFERENCE_FORM, t):.2g})")


@LOSS_MATCHES_RECOMPUTATION.judges('builder')
def i8_loss_matches_recomputation_builder(ev: BuilderEvidence) -> str | None:
    """The returned logits are ``[q·k⁺, q·queue]/T`` (the reference's ``contrastive_logits``)
    recomputed from ``encoder_q``'s and ``encoder_k``'s recorded outputs and the queue buffer,
    up to the order of the negative columns, and the labels are ``zeros(B)`` (the positive is
    column 0), so the cross-entropy is −ln p⁺. (Which ingredient differs from the reference is
    judged by the other I8 checks and by I9; this one fails only when no known form fits or
    the labels are wrong.)"""
    fit = ev.logits
    if not fit.all_match:
        t = next(i for i, ok in enumerate(fit.matched) if not ok)
        step = ev.logit_steps[t]
        reference = expected_logits(BUILDER_FORM, step, ev.temperature)
        error = logits_error(step.logits, reference)
        fail("the logits are not ones the grader can recompute from q, k and the queue",
             where=f"{builder_where(t)}, row 0:",
             expected=f"[q·k⁺, q·queue]/T with T = {ev.temperature:g}: "
                      f"{fmt_values(reference[0], limit=4)}",
             got=f"{fmt_values(step.logits[0], limit=4)} of shape {list(step.logits.shape)} "
                 f"(off by {error:.2g} of the largest logit; the closest known form, "
                 f"{describe_logits_form(fit.form)}, off by {fit.errors[t]:.2g})")
    for step in ev.steps:
        zeros = positive_labels(len(step.labels))
        if torch.equal(step.labels.to(torch.int64), zeros):
            continue
        arange = torch.equal(step.labels.to(torch.int64), torch.arange(len(step.labels)))
        fail("the labels are arange(B): each query is told its positive is column i, but the "
             "positive is column 0" if arange else "the labels do not point at the positive "
             "(column 0)", where=builder_where(step.index),
             expected=f"labels {fmt_ids(zeros)} (zeros)",
             got=f"labels {fmt_ids(step.labels)}")
    return "matches " + describe_logits_form(fit.form)


@LOSS_MATCHES_RECOMPUTATION.judges('components')
def i8_loss_matches_recomputation_components(ev: ComponentsEvidence) -> str | None:
    """``info_nce_loss(logits, labels=None)`` is the batch mean of −ln softmax(logits)[label],
    the label defaulting to column 0; −inf entries have probability 0."""
    for number, case, output in ev.outputs("loss"):
        t = case.tensors()
        expected = float(info_nce_loss(t["logits"], t["labels"]))
        got = output["loss"]
        if abs(got - expected) <= 1e-9 * max(1.0, abs(expected)):
            continue
        hint = ""
        if abs(got - expected * case.batch) <= 1e-9 * max(1.0, abs(expected * case.batch)):
            hint = " (summed over the batch instead of averaged)"
        fail("info_nce_loss is not the mean of −ln p⁺" + hint,
             where=f"in case {number} (B = {case.batch}, {case.columns} columns, labels "
                   f"{'given' if case.explicit_labels else 'default'})",
             expected=f"{expected:.10g}", got=f"{got:.10g}")
    return None


TEMPERATURE_DIVIDES_LOGITS = check(
    "I8-temperature-divides-logits",
    "logits are divided by T",
    points=1,
    contract=(
        "Logits are divided by the temperature T (not multiplied, not applied to the negatives "
        "only)."
    ),
)


@TEMPERATURE_DIVIDES_LOGITS.judges('lab')
def i8_temperature_divides_logits_lab(ev: LabEvidence) -> str | None:
    """Every logit, the positive and the negatives alike, is a cosine similarity divided by the
    temperature T (0.2 unless the assignment sets ``--temperature``)."""
    fit = ev.loss
    t_expected = ev.options.temperature
    if fit.temperature_fitted:
        fail("the loss uses another temperature", where="fitted over every step",
             expected=f"T = {t_expected:g}",
             got=f"T = {fit.temperature:.4g} (if the assignment uses it, grade with "
                 f"--temperature {fit.temperature:.4g})")
    fit = judgeable_loss(ev, "the temperature")
    for factor in ("temperature", "warmup_temperature"):
        rule = getattr(fit.form, factor)
        if rule == "divide":
            continue
        expected_form = replace(fit.form, **{factor: "divide"})
        t = evidence_step(ev, fit, expected_form)
        fail(FORM_TEXT[(factor, rule)], where=at_step(t, ev.steps[t].ids),
             expected=f"logits q·k/T with T = {t_expected:g}",
             got=("logits q·k·T (as if T were " + f"{1 / t_expected:g})"
                  if rule == "multiply" else "the positive q·k⁺ not divided by T")
                 + " " + gradient_evidence(ev, fit, expected_form, t))
    return None


@TEMPERATURE_DIVIDES_LOGITS.judges('builder')
def i8_temperature_divides_logits_builder(ev: BuilderEvidence) -> str | None:
    """Every logit, the positive and the negatives alike, is a cosine similarity divided by
    the T the module was built with (``--temperature``; the module's ``self.T`` is only
    quoted, not trusted)."""
    fit, t = ev.logits, ev.temperature
    if fit.temperature_fitted and fit.all_match:
        fitted = fit.temperature
        attribute = ev.module.get("attributes", {}).get("T")
        if math.isclose(fitted, 1.0, rel_tol=1e-3):
            misconception = "the logits were not divided by the temperature"
        elif attribute is not None and not math.isclose(attribute, t) and math.isclose(
                fitted, attribute, rel_tol=1e-3):
            misconception = f"the module ignores the T it was built with (self.T = {attribute:g})"
        else:
            misconception = "the logits use another temperature"
        fail(misconception, where="fitted over every step", expected=f"logits q·k/T, T = {t:g}",
             got=f"q·k/T with T = {fitted:.4g}")
    fit = judgeable_logits(ev, "the temperature")
    rule = fit.form.temperature
    if rule != "divide":
        fail(FORM_TEXT[("temperature", rule)], where=f"at every step (T = {t:g})",
             expected=f"logits q·k/T with T = {t:g}",
             got="logits q·k·T" if rule == "multiply" else "the positive q·k⁺ not divided by T")
    return None


@TEMPERATURE_DIVIDES_LOGITS.judges('components')
def i8_temperature_divides_logits_components(ev: ComponentsEvidence) -> str | None:
    """Every unmasked logit of ``contrastive_logits`` is ``q·k/T``: column 0 with the positive
    key, column 1 + j with queue entry j (oldest first)."""
    for _, case, t, reference, got, where in logits_runs(ev):
        both = ~masked_columns(reference) & ~masked_columns(got)
        if torch.allclose(got[both], reference[both], rtol=1e-9, atol=1e-12):
            continue
        multiplied = contrastive_logits(t["q"], t["k"], t["queue_keys"], t["queue_ids"], t["ids"],
                                        1.0 / case.temperature)
        is_multiplied = torch.allclose(got[both], multiplied[both], rtol=1e-9, atol=1e-12)
        fail("logits multiplied by T instead of divided" if is_multiplied
             else "logits are not q·k/T", where=where, expected=fmt_values(reference[both]),
             got=fmt_values(got[both]))
    return None


EMBEDDINGS_NORMALIZED = check(
    "I8-embeddings-normalized",
    "q and k are L2-normalized",
    points=1,
    contract=(
        "Queries and keys are L2-normalized before the logits are formed."
    ),
)


@EMBEDDINGS_NORMALIZED.judges('lab')
def i8_embeddings_normalized_lab(ev: LabEvidence) -> str | None:
    """The query and the key are L2-normalized projections, so every logit is a cosine
    similarity over T."""
    fit = judgeable_loss(ev, "the normalization of q and k")
    if fit.form.normalize == "both":
        return None
    expected_form = replace(fit.form, normalize="both")
    t = evidence_step(ev, fit, expected_form)
    which = "q" if fit.form.normalize == "q-raw" else "k"
    fail(f"{which} was not L2-normalized", where=at_step(t, ev.steps[t].ids),
         expected=f"{which} = F.normalize({'query' if which == 'q' else 'key'}(view)[1], dim=1)",
         got=f"the raw projection {gradient_evidence(ev, fit, expected_form, t)}")


@EMBEDDINGS_NORMALIZED.judges('builder')
def i8_embeddings_normalized_builder(ev: BuilderEvidence) -> str | None:
    """The query and the key are L2-normalized encoder outputs, so every logit is a cosine
    similarity over T."""
    fit = judgeable_logits(ev, "the normalization of q and k")
    if fit.form.normalize == "both":
        return None
    which = "q" if fit.form.normalize == "q-raw" else "k"
    step = ev.steps[0]
    raw = step.q if which == "q" else step.k
    fail(f"{which} was not L2-normalized", where=builder_where(0),
         expected=f"{which} = F.normalize(encoder_{which}(im_{which}), dim=1), of norm 1",
         got=f"the raw output, of norms {fmt_values(raw.norm(dim=1), limit=3)}")


EMPTY_QUEUE_IN_BATCH = check(
    "I8-empty-queue-in-batch",
    "with an empty queue the first batch uses in-batch negatives",
    points=1,
    contract=(
        "With an empty queue the first batch uses in-batch negatives: logits q·kᵀ / T with "
        "labels arange(B)."
    ),
)


@EMPTY_QUEUE_IN_BATCH.judges('lab')
def i8_empty_queue_in_batch_lab(ev: LabEvidence) -> str | None:
    """While the queue is empty (the first step) the loss is the in-batch form: logits
    ``q·kᵀ/T`` ``[B, B]``, labels ``arange(B)`` — each query's positive is its own key and the
    batch's other keys are its negatives."""
    fit = judgeable_loss(ev, "the first step's loss")
    step = ev.steps[0]
    expected_form = replace(fit.form, empty_queue="in-batch", negatives="before")
    error = loss_form_error(ev, expected_form, 0, fit.temperature)
    if error <= fit.tolerance:
        return None
    got = {
        "in-batch-zero-labels": "in-batch logits with labels all 0 (every query told that key 0 "
                                "is its positive)",
        "positive-only": "a loss of 0 and no gradient (no warm-up branch: each row had only its "
                         "positive)",
    }.get(fit.form.empty_queue, "another loss")
    fail("the first batch (empty queue) does not use in-batch negatives",
         where=at_step(0, step.ids), expected="logits q·kᵀ/T [B, B] with labels arange(B)",
         got=f"{got} (the in-batch form is off by {error:.2g})")


KEY_FROM_OTHER_VIEW = check(
    "I8-key-from-other-view",
    "the positive key comes from the image's other view",
    points=1,
    contract=(
        "The positive pair is two views of one image: the key encoder encodes a second, "
        "independent augmentation of the batch (LAB 07 calls views once per branch), never "
        "the very view the query encoder saw."
    ),
)


def _view_calls_of(event, ids: torch.Tensor) -> set[int]:
    """The view calls (−1: the raw image) the event's rows for these ids came from."""
    rows = torch.isin(event["rows_id"], ids) & (event["rows_call"] >= -1)
    return set(event["rows_call"][rows].tolist())


@KEY_FROM_OTHER_VIEW.judges('lab')
def i8_key_from_other_view_lab(ev: LabEvidence) -> str | None:
    """At every step the key encoder's input rows come from a call of ``views`` other than
    the ones the query encoder's rows came from (the probe traces each input row to the
    ``views`` call that made it); raw images on both sides count as one view."""
    events = ev.require_run()["events"]
    for step in ev.steps:
        query = _view_calls_of(events[step.query_event], step.ids)
        key = _view_calls_of(events[step.key_event], step.ids)
        shared = query & key
        if shared:
            source = ("the raw images x[ids] (views was not called for either branch)"
                      if shared == {-1} else f"view call {min(shared)}")
            fail("the key is encoded from the same augmented view as the query, so the "
                 "positive pair is one view twice (call views once per branch)",
                 where=at_step(step.index, step.ids),
                 expected="the key encoder's input from a second call views(x[ids])",
                 got=f"both encoders' inputs from {source}")
    return None
