"""I8: L = −ln p⁺ with the positive at column 0, logits / T, normalized embeddings, and
in-batch negatives while the queue is empty.

Long on purpose: the loss family's checks for the three styles sit together (one module per
family), with the diagnoses that name what departs (a factor, a permuted positive).
"""

from __future__ import annotations

import math

import torch

from moco_ref.core.contrastive import contrastive_logits, info_nce_loss, positive_labels
from moco_ref.judge import key_order
from moco_ref.judge.assertions import (
    Note,
    NotJudged,
    at_step,
    fail,
    fmt_ids,
    fmt_values,
)
from moco_ref.judge.builder_evidence import SYMMETRIC, VIEW_NAMES, BuilderEvidence
from moco_ref.judge.checks.common import (
    builder_where,
    factor_fault,
    fail_factor,
    fault_where,
    judgeable_logits,
    judgeable_loss_note,
    logits_runs,
    loss_series,
    loss_steps,
)
from moco_ref.judge.components_evidence import ComponentsEvidence
from moco_ref.judge.invariants import (
    REFERENCE_FORM,
    describe_logits_form,
    expected_logits,
    form_gradient,
    gradient_error,
    logits_error,
)
from moco_ref.judge.invariants.logits import (
    BUILDER_FORM,
    masked_columns,
    positive_images,
)
from moco_ref.judge.invariants.loss import FORM_TEXT, TEMPERATURE_RULES
from moco_ref.judge.invariants.loss_diagnosis import LossDiagnosis, departure
from moco_ref.judge.lab_evidence import LabEvidence
from moco_ref.judge.loss_story import story_verdict
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
    that of a recomputed InfoNCE loss from the recorded q, k, the queue rebuilt from recorded
    keys, the ids and T — in the reference's form or in a known mistaken one, fitted step by
    step. This check fails when no form explains a step, when the labels do not point at the
    positive (column 0), or when the loss is summed instead of averaged; which other
    ingredient differs is judged by the I2, I4, I8 and I9 check that owns it."""
    _fail_non_finite(ev)
    if ev.positive_order is not None:
        _fail_permuted_positives_lab(ev)
    diagnosis = ev.loss_diagnosis
    unexplained = diagnosis.unexplained
    if unexplained and _queue_changed_after_enqueue(ev):
        raise NotJudged("I2-entries-are-arrival-keys",
                        "the queue's entries were rescaled after they were enqueued, so the "
                        "negatives each step used cannot be rebuilt from the keys as enqueued")
    if unexplained:
        t = unexplained[0]
        step = ev.steps[t]
        if step.grad is None:
            fail("no gradient of the loss reached the query encoder", where=at_step(t, step.ids),
                 expected="loss.backward() through q = normalize(query(view)[1])",
                 got="no gradient")
        closest = diagnosis.fit.form
        runs = "" if len(diagnosis.runs()) == 1 else (
            f"; over the run, {diagnosis.narrative(ev.queue_context)}")
        fail("the loss is not one the grader can recompute" + _scale_hint(ev, t, diagnosis),
             where=fault_where(ev, unexplained),
             expected=f"dL/dq of {closest.describe()} (T = {diagnosis.temperature:g})",
             got=f"a gradient off by {diagnosis.steps[t].error:.2g} of its size, "
                 f"{departure(ev.loss_inputs[t], closest, diagnosis.temperature)}{runs}",
             details={"steps": unexplained,
                      "loss_by_step": diagnosis.narrative(ev.queue_context, 12),
                      "loss_story": diagnosis.story(ev.queue_context),
                      **loss_series(ev, diagnosis)})
    steps = list(range(len(ev.steps)))
    fault = factor_fault(diagnosis, steps, "labels", tuple(LABELS_TEXT))
    if fault:
        misconception, got = LABELS_TEXT[fault[2].labels]
        fail_factor(ev, diagnosis, fault, "labels", misconception,
                    expected="labels zeros(B): the positive q·k⁺ is column 0",
                    got=got.format(columns=_columns(ev, diagnosis, fault[0])))
    fault = factor_fault(diagnosis, steps, "extra", ("queries",))
    if fault:
        t = fault[0]
        held = len(ev.loss_inputs[t].negatives[fault[2].negatives][1])
        batch = len(ev.steps[t].ids)
        fail_factor(ev, diagnosis, fault, "extra",
                    "the batch's other queries are used as extra negatives (q·qᵀ): MoCo's "
                    "negatives are the queued keys only",
                    expected=f"logits [q·k⁺, q·queueᵀ]/T, 1 + {held} columns",
                    got=f"[q·k⁺, q·queueᵀ, q·qᵀ]/T, 1 + {held} + {batch} columns (each "
                        "query's own column hidden)")
    fault = parameter_fault(diagnosis, steps, "scale")
    if fault:
        scale = fault[2].scale
        fail_factor(ev, diagnosis, fault, "scale",
                    f"the loss is multiplied by {scale:.4g} (divided by {1 / scale:.4g}) "
                    "before backward",
                    expected="the batch mean of −ln p⁺, unscaled",
                    got=f"{scale:.4g} × the mean of −ln p⁺ at every step")
    fault = parameter_fault(diagnosis, steps, "smoothing")
    if fault:
        epsilon = fault[2].smoothing
        fail_factor(ev, diagnosis, fault, "smoothing",
                    f"the loss is cross_entropy with label_smoothing={epsilon:.3g}: {epsilon:.3g} "
                    "of the target is spread over every column, so each query is also pulled "
                    "toward the queue's negatives; MoCo's loss is −ln p⁺ with the whole target "
                    "on the positive",
                    expected="F.cross_entropy(logits, labels), no label smoothing",
                    got=f"(1 − {epsilon:.3g})·(−ln p⁺) + {epsilon:.3g}·mean over columns of "
                        "(−ln p)")
    fault = parameter_fault(diagnosis, steps, "newest")
    if fault:
        t = fault[0]
        held = len(ev.loss_inputs[t].negatives[fault[2].negatives][1])
        fail_factor(ev, diagnosis, fault, "newest",
                    f"only the newest {fault[2].newest} queued keys are used as negatives, "
                    "not the whole queue",
                    expected=f"all {held} queued keys as negatives, [q·k⁺, q·queueᵀ]/T",
                    got=f"[q·k⁺, q·queue[-{fault[2].newest}:]ᵀ]/T")
    fault = factor_fault(diagnosis, steps, "negatives", ("with-empty-slots", "zero-initialized"))
    if fault:
        _fail_empty_slots(ev, diagnosis, fault)
    fault = factor_fault(diagnosis, steps, "reduction", ("sum",))
    if fault:
        fail_factor(ev, diagnosis, fault, "reduction",
                    "the loss is summed over the batch instead of averaged",
                    expected="the batch mean of −ln p⁺ (F.cross_entropy's default)",
                    got=f"the sum over the {len(ev.steps[fault[0]].ids)} queries")
    fault = factor_fault(diagnosis, steps, "scores", ("softmax",))
    if fault:
        fail_factor(ev, diagnosis, fault, "scores",
                    "softmax probabilities are handed to cross_entropy, which applies its own "
                    "softmax: a double softmax squeezes every score into [0, 1], so the loss "
                    "barely separates the positive from the negatives",
                    expected="F.cross_entropy(logits, labels) on the logits [q·k⁺, q·queueᵀ]/T",
                    got="F.cross_entropy(softmax(logits), labels) = −ln softmax(softmax("
                        "logits))[label]")
    fault = factor_fault(diagnosis, steps, "denominator", ("negatives-only",))
    if fault:
        fail_factor(ev, diagnosis, fault, "denominator",
                    "the positive is left out of the softmax denominator",
                    expected="−ln p⁺ = −q·k⁺/T + ln(e^(q·k⁺/T) + Σ_neg e^(q·n/T)) "
                             "(F.cross_entropy over [positive, negatives])",
                    got="−q·k⁺/T + ln Σ_neg e^(q·n/T)")
    story = diagnosis.pass_story(ev.queue_context)
    return Note(story_verdict(story), {"loss_story": story, "loss_story_is_message": True})


def _fail_non_finite(ev: LabEvidence) -> None:
    """−ln p⁺ of unit vectors over T is finite: a run whose values turn NaN or infinite has a
    loss that took the log of 0 (a probability computed, then logged) or divided by 0."""
    found = ev.first_non_finite
    if found is None:
        return
    t, what = found
    fail("the training run became NaN or infinite: −ln p⁺ is finite for unit vectors over T, "
         "so the loss took a log of 0 or divided by 0 (e.g. log(softmax(…)) of a masked "
         "column, a probability divided by T, a temperature that reaches 0)",
         where=ev.step_where(t),
         expected="finite values at every step",
         got=f"{what} holds NaN or inf from this step on")


def _fail_empty_slots(ev: LabEvidence, diagnosis: LossDiagnosis, fault) -> None:
    t, _, form = fault
    held = len(ev.loss_inputs[t].negatives["before"][1])
    capacity = len(ev.loss_inputs[t].negatives[form.negatives][1])
    never_empty = form.negatives == "zero-initialized"
    fail_factor(ev, diagnosis, fault, "negatives",
                "the queue's unfilled slots are used as negatives: a preallocated queue read "
                "whole, so each empty (zero) slot adds a logit of 0 that still counts in the "
                "softmax" + ("; and as the queue is never empty, no step is a warm-up"
                             if never_empty else ""),
                expected=(f"the {held} keys the queue holds as negatives, "
                          f"[q·k⁺, q·queue[:{held}]ᵀ]/T" if held else
                          "the in-batch warm-up loss q·kᵀ/T (the queue holds no key yet)"),
                got=f"[q·k⁺, q·bufferᵀ]/T over all {capacity} slots, {capacity - held} of "
                    "them never written")


def parameter_fault(diagnosis: LossDiagnosis, steps: list[int], parameter: str):
    """``(first step, every such step, its form)`` of the given steps whose loss has the
    numeric ``parameter`` (``queue_t``, ``scale``, …) fitted, or None."""
    faulty = [t for t in steps if diagnosis.form_at(t) is not None
              and getattr(diagnosis.form_at(t), parameter) is not None]
    return (faulty[0], faulty, diagnosis.form_at(faulty[0])) if faulty else None


LABELS_TEXT = {
    "ones": ("the labels point at column 1 (the oldest queued key), not at the positive",
             "labels ones(B)"),
    "arange": ("the queue branch keeps the in-batch labels arange(B): query i is told its "
               "positive is column i, a queued key for every i > 0, not column 0",
               "labels arange(B) over {columns} columns"),
    "last": ("the labels point at the last column (the newest queued key), not at the "
             "positive in column 0", "labels {columns} − 1 (the last of {columns} columns)"),
}


def _columns(ev: LabEvidence, diagnosis, t: int) -> int:
    form = diagnosis.form_at(t)
    keys = ev.loss_inputs[t].negatives[form.negatives][0]
    return 1 + (len(keys) if form.newest is None else min(form.newest, len(keys)))


def _scale_hint(ev: LabEvidence, t: int, diagnosis) -> str:
    result = form_gradient(REFERENCE_FORM, ev.loss_inputs[t], ev.options.temperature)
    if result is None:
        return ""
    reference, observed = result[1], ev.steps[t].grad.to(torch.float64)
    scale = float((observed * reference).sum() / (reference ** 2).sum())
    if abs(scale - 1) > 0.01 and gradient_error(observed, scale * reference) < diagnosis.tolerance:
        return f" (the loss is the reference's times {scale:.4g})"
    return ""


def _positive_images(ev: BuilderEvidence, t: int) -> list[int] | None:
    return positive_images(ev.logit_steps[t], ev.temperature)


def _shuffle_cause(ev: BuilderEvidence, t: int, images: list[int]) -> str:
    """Why the keys are out of order, read from the rows the key encoder ran on
    (``key_order.rule_of``); empty when no known rule explains it."""
    if ev.variant == SYMMETRIC:
        return ""
    step = ev.steps[t]
    try:
        rows = ev.record["run"]["steps"][t]["events"][step.key_event]["rows"].tolist()
    except (KeyError, IndexError, AttributeError, TypeError):
        return ""
    rule = key_order.rule_of(images, rows)
    return key_order.cause(rule, rows if rule == "unshuffle missing" else None)


def _fail_permuted_positives(where: str, pairs: list[tuple[str, str]], total: int, why: str,
                             details: dict) -> None:
    """``pairs``: (a query, the image whose key was its positive) where they differ."""
    shown = ", ".join(f"{query}'s positive is the key of image {image}"
                      for query, image in pairs[:4])
    more = f", … ({len(pairs)} of {total} queries)" if len(pairs) > 4 else \
        f" ({len(pairs)} of {total} queries)"
    fail("each query's positive is another image's key: the keys come back from the key "
         "encoder in another order than their images (the batch is shuffled before the key "
         "encoder and not put back in image order)",
         where=where, expected="query i's positive q·k of image i, its own image's key",
         got=f"{shown}{more}{why}", details=details)


def _fail_permuted_positives_builder(ev: BuilderEvidence, t: int, images: list[int]) -> None:
    pairs = [(f"query {i}", str(j)) for i, j in enumerate(images) if i != j]
    _fail_permuted_positives(f"{ev.logit_where(t)}:", pairs, len(images),
                             _shuffle_cause(ev, t, images),
                             {"positive_images": images, "step": t})


def _fail_permuted_positives_lab(ev: LabEvidence) -> None:
    order = ev.positive_order
    steps = [s for s, rows in enumerate(order.orders)
             if not torch.equal(rows, torch.arange(len(rows)))]
    t = steps[0]
    step = ev.steps[t]
    images = step.ids[order.orders[t]].tolist()
    pairs = [(f"the query of image {query}", str(image))
             for query, image in zip(step.ids.tolist(), images) if query != image]
    _fail_permuted_positives(f"{fault_where(ev, steps)}:", pairs, len(images),
                             key_order.cause(order.rule),
                             {"positive_images": images, "step": t, "steps": steps})


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
        images = _positive_images(ev, t)
        if images is not None:
            _fail_permuted_positives_builder(ev, t, images)
        step = ev.logit_steps[t]
        reference = expected_logits(BUILDER_FORM, step, ev.temperature)
        error = logits_error(step.logits, reference)
        fail("the logits are not ones the grader can recompute from q, k and the queue",
             where=f"{ev.logit_where(t)}, row 0:",
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
    _judge_returned_loss(ev)
    return "matches " + describe_logits_form(fit.form)


def _judge_returned_loss(ev: BuilderEvidence) -> None:
    """A loss ``forward`` returns itself is what the query encoder trains on: it must be the
    cross-entropy of the module's own logits (both halves' summed), up to one positive scale."""
    loss = ev.returned_loss
    if loss is None or loss.consistent:
        return
    halves = len(ev.steps[0].halves) == 2
    weights = (" (fitted over the steps: " + " + ".join(
        f"{w:g}·CE{i + 1}" for i, w in enumerate(loss.weights)).replace("+ -", "− ") + ")"
        if loss.weights else "")
    fail("the loss forward returns is not the cross-entropy of its logits "
         + ("summed over both halves " if halves else "")
         + "up to one positive scale: the query encoder is trained on another objective"
         + (" (a half subtracted, dropped or weighted apart)" if halves else ""),
         where=builder_where(loss.first_off),
         expected=("c·(CE1 + CE2), one c > 0 for every step, CE1 and CE2 the cross-entropies "
                   "of the two halves' logits" if halves else
                   "c·CE of its logits, one c > 0 for every step"),
         got=f"{loss.loss_off:.6g} where the cross-entropies are "
             + " and ".join(f"{part:.6g}" for part in loss.parts_off)
             + (f" (the steps before gave c = {loss.scale_before:.4g})"
                if loss.scale_before is not None else "") + weights)


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
    """Every logit, the positive and the negatives alike, in the queue branch and in the
    in-batch branch, is a cosine similarity divided by the temperature T (0.2 unless the
    assignment sets ``--temperature``)."""
    fit = ev.loss
    t_expected = ev.options.temperature
    if fit.temperature_fitted:
        fail("the loss uses another temperature", where="fitted over every step",
             expected=f"T = {t_expected:g}",
             got=f"T = {fit.temperature:.4g} (if the assignment uses it, grade with "
                 f"--temperature {fit.temperature:.4g})")
    diagnosis, steps = loss_steps(ev, "the temperature")
    for factor, branch in (("queue_t", "queue"), ("warmup_t", "in-batch (warm-up)")):
        fault = parameter_fault(diagnosis, steps, factor)
        if fault:
            value = getattr(fault[2], factor)
            ratio = t_expected / value
            fail_factor(ev, diagnosis, fault, factor,
                        f"the {branch} branch's logits are divided by another temperature, "
                        f"{value:.4g}, while the other branch uses T",
                        expected=f"{branch} logits q·k/T with T = {t_expected:g}",
                        got=f"q·k/{value:.4g} (the logits scaled by {ratio:.4g})")
    for factor in ("temperature", "warmup_temperature"):
        fault = factor_fault(diagnosis, steps, factor, TEMPERATURE_RULES[1:])
        if fault:
            rule = getattr(fault[2], factor)
            fail_factor(ev, diagnosis, fault, factor, FORM_TEXT[(factor, rule)],
                        expected=f"logits q·k/T with T = {t_expected:g}",
                        got=TEMPERATURE_GOT[rule].format(T=t_expected, inverse=1 / t_expected,
                                                         square=t_expected ** 2))
    return judgeable_loss_note(diagnosis, steps, len(ev.steps))


TEMPERATURE_GOT = {
    "multiply": "logits q·k·T (as if T were {inverse:g})",
    "positive-undivided": "the positive q·k⁺ not divided by T",
    "negatives-undivided": "q·k⁺/T but the negatives q·queue undivided",
    "none": "logits q·k, undivided (as if T were 1)",
    "twice": "logits q·k/T/T (as if T were {square:g})",
}


@TEMPERATURE_DIVIDES_LOGITS.judges('builder')
def i8_temperature_divides_logits_builder(ev: BuilderEvidence) -> str | None:
    """Every logit, the positive and the negatives alike, is a cosine similarity divided by
    the T the module was built with (``--temperature``; the module's ``self.T`` is only
    quoted, not trusted)."""
    fit, t = ev.logits, ev.temperature
    if fit.all_match and fit.form.positive_t is not None:
        fail("the positive and the negatives are divided by different temperatures",
             where="fitted over every step",
             expected=f"q·k⁺/T and q·queue/T, one T = {t:g}",
             got=f"q·k⁺/{fit.form.positive_t:.4g} and q·queue/{fit.temperature:.4g}")
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


def _queue_changed_after_enqueue(ev: LabEvidence) -> bool:
    try:
        return ev.queue.changed_after_enqueue
    except Exception:  # noqa: BLE001 - an unreadable queue is another check's to tell
        return False


def _p_name(p: float) -> str:
    return "largest absolute value" if p == float("inf") else f"L{p:g} norm"


_NORMALIZED_OTHERWISE = ("the keys were enqueued normalized otherwise than by their L2 norm: "
                         "the queue's negatives are not unit vectors")
_UNIT_KEY = "the normalized key k = F.normalize(key(view)[1], dim=1), of L2 norm 1"
# A queue kind of lab_evidence.STORED_KINDS that stores the key not L2-normalized:
# (misconception, expected, what the entries are, the name of the norm shown of one)
_STORED_UNNORMALIZED = {
    "raw key": ("the keys were enqueued before L2 normalization: the queue's negatives are raw "
                "projections while the positive is normalized",
                "the normalized key k = F.normalize(key(view)[1], dim=1), of norm 1",
                "the raw key projection", "norm"),
    "rescaled key": (_NORMALIZED_OTHERWISE, _UNIT_KEY, "the key's direction at another length",
                     "L2 norm"),
    "batch-normalized key": (_NORMALIZED_OTHERWISE, _UNIT_KEY,
                             "each feature normalized over the batch (dim=0), not each key over "
                             "its features", "L2 norm"),
}


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
    queue = ev.queue
    if queue.stored_kind in _STORED_UNNORMALIZED and not queue.changed_after_enqueue:
        kind = queue.stored_kind
        j = queue.kinds.index(kind)
        step, _ = queue.sources[j]
        misconception, expected, how, norm = _STORED_UNNORMALIZED[kind]
        if kind == "rescaled key" and queue.norm_p is not None:
            how = f"normalized with p={queue.norm_p:g} (its {_p_name(queue.norm_p)} is 1)"
        fail(misconception,
             where=f"queue entry {j} (id {int(queue.ids[j])}, enqueued at step {step}), "
                   f"{queue.kinds.count(kind)} of {len(queue.kinds)} entries:",
             expected=expected, got=f"{how}, of {norm} {float(queue.keys[j].norm()):.3g}")
    diagnosis, steps = loss_steps(ev, "the normalization of q and k")
    fault = factor_fault(diagnosis, steps, "normalize", ("q-raw", "k-raw", "k-batch", "q-batch",
                                                         "k-matrix"))
    if fault and fault[2].normalize == "k-matrix":
        fail_factor(ev, diagnosis, fault, "normalize",
                    "k was divided by the norm of the whole [B, d] matrix of keys (k / k.norm(), "
                    "one number for the batch), not each key by its own norm: the keys are not "
                    "unit vectors, so q·k is no cosine",
                    expected="k = F.normalize(key(view)[1], dim=1): every row of norm 1",
                    got="k / k.norm(): rows of norm about 1/√B")
    if fault:
        rule = fault[2].normalize
        which, net = ("q", "query") if rule.startswith("q") else ("k", "key")
        over_batch = rule.endswith("-batch")
        fail_factor(ev, diagnosis, fault, "normalize",
                    f"{which} was normalized over the batch (dim=0), not each {net} over its "
                    "features" if over_batch else f"{which} was not L2-normalized",
                    expected=f"{which} = F.normalize({net}(view)[1], dim=1)",
                    got=f"F.normalize({net}(view)[1], dim=0)" if over_batch
                    else "the raw projection")
    return judgeable_loss_note(diagnosis, steps, len(ev.steps))


@EMBEDDINGS_NORMALIZED.judges('builder')
def i8_embeddings_normalized_builder(ev: BuilderEvidence) -> str | None:
    """The query and the key are L2-normalized encoder outputs, so every logit is a cosine
    similarity over T."""
    fit = judgeable_logits(ev, "the normalization of q and k")
    if fit.form.normalize == "both":
        return None
    step = ev.steps[0]
    if fit.form.normalize == "k-batch":
        norms = torch.nn.functional.normalize(step.k.to(torch.float64), dim=0).norm(dim=1)
        fail("k was normalized over the batch (dim=0), not each key over its features",
             where=builder_where(0),
             expected="k = F.normalize(encoder_k(im_k), dim=1), each key of norm 1",
             got=f"F.normalize(k, dim=0): each feature of norm 1 over the batch, keys of norms "
                 f"{fmt_values(norms, limit=3)}")
    which = "q" if fit.form.normalize == "q-raw" else "k"
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
    batch's other keys are its negatives. Once the queue holds keys, they are the negatives:
    the in-batch branch is for the empty queue only."""
    diagnosis, steps = loss_steps(ev, "which branch of the loss each step took")
    fault = factor_fault(diagnosis, [t for t in steps if t == 0], "empty_queue",
                         ("in-batch-zero-labels", "positive-only", "symmetric"))
    if fault:
        got = {
            "in-batch-zero-labels": "in-batch logits with labels all 0 (every query told that "
                                    "key 0 is its positive)",
            "positive-only": "a loss of 0 and no gradient (no warm-up branch: each row had only "
                             "its positive)",
            "symmetric": "a symmetric loss: the mean of the cross-entropies of q·kᵀ/T and of its "
                         "transpose k·qᵀ/T (each key also told its own query)",
        }[fault[2].empty_queue]
        fail_factor(ev, diagnosis, fault, "empty_queue",
                    "the first batch (empty queue) does not use in-batch negatives",
                    expected="logits q·kᵀ/T [B, B] with labels arange(B)", got=got)
    fault = factor_fault(diagnosis, [t for t in steps if t > 0], "branch", ("in-batch",))
    if fault:
        held = len(ev.loss_inputs[fault[0]].negatives["before"][1])
        never_read = set(range(1, len(ev.steps))) <= set(fault[1])
        fail_factor(ev, diagnosis, fault, "branch",
                    "the in-batch (warm-up) branch was used although the queue holds keys",
                    expected=f"the {held} queued keys as negatives, [q·k⁺, q·queueᵀ]/T",
                    got="in-batch logits q·kᵀ/T, the queue unused",
                    # the queue never read as negatives: the dictionary's families are dead
                    details={"disables": ["I2", "I3", "I4"]} if never_read else None)
    return judgeable_loss_note(diagnosis, steps, len(ev.steps))


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


RAW_IMAGE = -1  # the view call a row of the raw images x[ids] is traced to


def _view_calls_of(event, ids: torch.Tensor) -> set[int]:
    """The view calls (−1: the raw image) the event's rows for these ids came from."""
    rows = torch.isin(event["rows_id"], ids) & (event["rows_call"] >= -1)
    return set(event["rows_call"][rows].tolist())


@KEY_FROM_OTHER_VIEW.judges('lab')
def i8_key_from_other_view_lab(ev: LabEvidence) -> str | None:
    """At every step the key encoder's input rows come from a call of ``views`` other than
    the ones the query encoder's rows came from (the probe traces each input row to the
    ``views`` call that made it); raw images on both sides count as one view, and raw
    images on one side only are no view of their own: the positive pair is two
    augmentations."""
    events = ev.require_run()["events"]
    for step in ev.steps:
        query = _view_calls_of(events[step.query_event], step.ids)
        key = _view_calls_of(events[step.key_event], step.ids)
        shared = query & key
        raw = [side for side, calls in (("key", key), ("query", query)) if RAW_IMAGE in calls]
        if len(raw) == 1 and not shared:
            side, other = raw[0], "query" if raw[0] == "key" else "key"
            augmented = (query if side == "key" else key) - {RAW_IMAGE}
            fail(f"the {side} is encoded from the raw, un-augmented image and only the {other} "
                 "from an augmented view, so the positive pair is not two views of one image "
                 "(call views once per branch)",
                 where=at_step(step.index, step.ids),
                 expected=f"the {side} encoder's input from its own call views(x[ids])",
                 got=f"the {side} encoder's input the raw images x[ids], the {other}'s from "
                     f"view call {min(augmented, default=RAW_IMAGE)}")
        if shared:
            source = ("the raw images x[ids] (views was not called for either branch)"
                      if shared == {-1} else f"view call {min(shared)}")
            fail("the key is encoded from the same augmented view as the query, so the "
                 "positive pair is one view twice (call views once per branch)",
                 where=at_step(step.index, step.ids),
                 expected="the key encoder's input from a second call views(x[ids])",
                 got=f"both encoders' inputs from {source}")
    return None


@KEY_FROM_OTHER_VIEW.judges('builder')
def i8_key_from_other_view_builder(ev: BuilderEvidence) -> str | None:
    """At every step ``encoder_k`` encodes ``im_k`` (for a symmetric module, each view is the
    other's key), never only ``im_q``, the view the query encoder saw: the positive pair is
    two views of one image (the probe traces each input row to the view it came from)."""
    t = ev.key_from_query_view
    if t is not None:
        fail("the key is encoded from im_q, the very view the query encoder saw, so the "
             "positive pair is one view twice, not two views of one image",
             where=builder_where(t),
             expected="k = encoder_k(im_k): the key from the batch's second view",
             got="encoder_k ran on the rows of im_q only")
    return None


POSITIVE_ACROSS_RANKS = check(
    "I8-positive-across-ranks",
    "on several processes each query's positive is its own image's key",
    points=1,
    contract=(
        "Trained on several processes with shuffle-BN, every query's positive logit uses the "
        "key of its own image, whichever rank's key encoder computed it: all ranks shuffle "
        "with one permutation (rank 0's, broadcast) and the unshuffle undoes it. In a "
        "symmetric module, both halves: each view's query against the other view's key of "
        "its own image."
    ),
)


@POSITIVE_ACROSS_RANKS.judges('builder')
def i8_positive_across_ranks_builder(ev: BuilderEvidence) -> str | None:
    """In the two-process run, the positive logit each rank returns for its query i is, in the
    form the one-process run was fitted to, ``q_i·k_g / T`` with ``g`` the query's own image —
    the grader traces every key-encoder row on every rank to its image and finds which key
    explains each returned positive. A symmetric module's two pairs are both judged, each
    query's positive the key of its own image's other view."""
    fit = ev.logits  # a one-process crash is told first
    ranks = ev.ranks
    ranks.runs  # noqa: B018 - raises when the run is missing or a rank raised
    if ev.key_from_query_view is not None:
        raise NotJudged("I8-key-from-other-view", "the key is encoded from the query's own "
                                                  "view, so no rank's key is another view")
    if not fit.all_match:
        raise NotJudged("I8-loss-matches-recomputation",
                        "the one-process logits are in no known form, so a positive logit "
                        "cannot be traced to its key")
    for t in range(ranks.steps):
        for rank in range(ranks.world):
            for half in ranks.positives(t, rank, fit.form, fit.temperature):
                _judge_half(ranks, t, rank, half)
    how = ("keys computed on other ranks came back to their queries"
           if ranks.shuffled_across_ranks() else "each rank computed its own keys")
    both = ", both halves" if ev.variant == SYMMETRIC else ""
    return f"{ranks.world} processes, {ranks.steps} steps{both}: {how}"


def _judge_half(ranks, t: int, rank: int, half) -> None:
    """Every query of one returned pair has the key of its own image (of ``half.key_view``);
    otherwise fails naming, per query, whose key its positive is."""
    of = (f" (q of {VIEW_NAMES[half.query_view]} against the key of "
          f"{VIEW_NAMES[half.key_view]})" if ranks.symmetric else "")
    wrong = [(i, image, key) for i, (image, key) in enumerate(zip(ranks.rows_of(rank),
                                                                   half.used))
             if key is None or key.slot != (half.key_view, image)]
    if not wrong:
        return
    if not ranks.partitioned(t):
        cause = ("the ranks shuffled with different permutations (rank 0's permutation is not "
                 "broadcast), so the unshuffle hands queries the keys of other images")
    else:
        cause = "the shuffle is not undone"

    def took(i: int, image: int, key) -> str:
        own = ranks.describe((half.key_view, image))
        if key is None:
            return f"query {i} ({own}): a positive that is q·k of no key computed at this step"
        return (f"query {i} ({own}) took the key of {ranks.describe(key.slot)} (computed on "
                f"rank {key.rank})")

    shown = "; ".join(took(*w) for w in wrong[:3])
    count = len(half.used)
    more = f"; … {len(wrong)} of {count} queries" if len(wrong) > 3 else \
        f" ({len(wrong)} of {count} queries)"
    fail(f"each query's positive is another image's key: {cause}",
         where=f"at step {t} of the two-process run, rank {rank}{of}:",
         expected="each query's positive q·k of its own image's key",
         got=f"{shown}{more}",
         details={"queries": [i for i, _, _ in wrong], "step": t, "rank": rank})
