"""I8 and I9 on the logits a module *returns* (the ``builder`` style), on plain tensors.

The expected logits of a step are the reference's ``form_logits`` (``loss.py``: the reference
form is ``contrastive_logits`` ``[q·k⁺, q·queue]/T``) from the recorded raw encoder outputs
and a recorded queue buffer; a mistaken form changes one choice (``LossForm``'s
``temperature``, ``normalize`` and ``negatives``; no ids, so no mask). The form that explains
the observed logits of every step is found by trying them all; if none does at the given T,
T itself is fitted (in closed form: the logits are linear in 1/T).

Negatives are compared as a set per row (sorted): the loss does not depend on the order of
the negative columns, so a module may lay its queue out in any order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from moco_ref.judge.invariants.loss import (
    FORM_TEXT,
    PARAMETER_TEXT,
    REFERENCE_FORM,
    LossForm,
    StepwiseFit,
    form_logits,
)

MASKED_BELOW = -1e3  # a logit this low has softmax probability 0 next to |logit| ≤ 1/T


def masked_columns(logits: torch.Tensor) -> torch.Tensor:
    """``[B, 1+n]`` True where a logit counts as masked (−inf, or below ``MASKED_BELOW``): the
    one threshold every check uses."""
    return torch.isneginf(logits) | (logits < MASKED_BELOW)


LOGITS_TOLERANCE = 1e-4  # max-abs error relative to max(1, largest expected logit)
BUILDER_FORM = replace(REFERENCE_FORM, mask="none")  # no ids: nothing to mask
BUILDER_CHOICES: dict[str, tuple[str, ...]] = {
    "temperature": ("divide", "multiply", "positive-undivided"),
    "normalize": ("both", "q-raw", "k-raw", "k-batch"),
    "negatives": ("before", "after"),
}


def describe_logits_form(form: LossForm) -> str:
    """What ``form`` computes, in words (the mask, absent without ids, is not mentioned)."""
    changed = [PARAMETER_TEXT[name](value) if name in PARAMETER_TEXT else FORM_TEXT[(name, value)]
               for name, value in form.differences().items() if name != "mask"]
    return "; ".join(changed) if changed else "the reference logits [q·k⁺, q·queue]/T"


@dataclass
class StepLogits:
    """One step as observed: raw encoder outputs, the returned logits, the buffer's columns."""

    q: torch.Tensor  # [B, d] encoder_q's raw output, im_q row order
    k: torch.Tensor  # [B, d] encoder_k's raw output, im_k row order (row i: query i's positive)
    logits: torch.Tensor  # [B, 1 + n] as returned
    negatives: dict[str, torch.Tensor]  # "before"/"after" the step: the queue's columns [n, d]


def expected_logits(form: LossForm, step: StepLogits, temperature: float) -> torch.Tensor:
    """``[B, 1 + n]`` float64 logits of ``form`` at ``step``."""
    q = step.q.to(torch.float64)
    k = step.k.to(torch.float64)
    if form.normalize != "q-raw":
        q = F.normalize(q, dim=1)
    if form.normalize != "k-raw":
        k = F.normalize(k, dim=0 if form.normalize == "k-batch" else 1)
    negatives = step.negatives[form.negatives].to(torch.float64)
    logits, _ = form_logits(form, q, k, negatives, None, None, temperature)
    return logits


def canonical_logits(logits: torch.Tensor) -> torch.Tensor:
    """Positive column first, then each row's negatives sorted: order-free comparison."""
    logits = logits.to(torch.float64)
    return torch.cat([logits[:, :1], logits[:, 1:].sort(dim=1).values], dim=1)


def logits_error(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Max-abs difference of the canonical forms up to one constant per row (softmax and the
    cross-entropy do not see it: ``logits - logits.max(1)`` is the same loss), relative to
    max(1, largest expected logit); inf when the shapes differ or the observed logits are
    not finite."""
    if observed.shape != expected.shape or not bool(torch.isfinite(observed).all()):
        return math.inf
    scale = max(1.0, float(expected.abs().max()))
    difference = canonical_logits(observed) - canonical_logits(expected)  # [B, 1 + K]
    difference = difference - difference.mean(dim=1, keepdim=True)
    return float(difference.abs().max()) / scale


@dataclass
class LogitsFit(StepwiseFit):
    """The form and temperature that explain the observed logits, step by step."""

    tolerance: float = LOGITS_TOLERANCE
    temperature_fitted: bool = False


def candidate_forms() -> list[LossForm]:
    """The reference's form and every combination of the choices a module can get wrong."""
    names = list(BUILDER_CHOICES)
    return [replace(BUILDER_FORM, **dict(zip(names, values)))
            for values in itertools.product(*BUILDER_CHOICES.values())]


def form_errors(form: LossForm, steps: Sequence[StepLogits], temperature: float) -> list[float]:
    return [logits_error(s.logits, expected_logits(form, s, temperature)) for s in steps]


def fit_temperature(form: LossForm, steps: Sequence[StepLogits],
                    columns: slice = slice(None)) -> float | None:
    """Least-squares T with ``observed ≈ (logits of form at T = 1) / T`` (``form`` divides)
    over the logits' ``columns`` (canonical order: the positive, then the sorted negatives);
    None when they carry no information or T would not be positive."""
    numerator = denominator = 0.0
    for step in steps:
        if not bool(torch.isfinite(step.logits).all()):
            return None
        raw = expected_logits(form, step, 1.0)
        if raw.shape != step.logits.shape:
            return None
        observed, raw = canonical_logits(step.logits)[:, columns], canonical_logits(raw)[:, columns]
        numerator += float((observed * raw).sum())
        denominator += float((raw * raw).sum())
    if denominator == 0.0 or numerator <= 0.0:
        return None
    return denominator / numerator


def positive_images(step: StepLogits, temperature: float) -> list[int] | None:
    """For a step whose negatives are the reference's (the queue before the step, over T) but
    whose positives are not: the image ``j`` whose key gives each query ``i``'s positive
    ``q̂_i·k̂_j / T``, when every row has one and some ``j ≠ i`` (the keys came back from the
    key encoder in another order than their images); None otherwise."""
    logits = step.logits.to(torch.float64)
    reference = expected_logits(BUILDER_FORM, step, temperature)
    if logits.shape != reference.shape or len(logits) < 2:
        return None
    scale = max(1.0, float(reference.abs().max()))
    negatives = (logits[:, 1:].sort(dim=1).values - reference[:, 1:].sort(dim=1).values)
    if negatives.numel() and float(negatives.abs().max()) / scale > LOGITS_TOLERANCE:
        return None
    q = F.normalize(step.q.to(torch.float64), dim=1)
    k = F.normalize(step.k.to(torch.float64), dim=1)
    candidates = q @ k.T / temperature  # [B, B]: query i against image j's key
    errors = (candidates - logits[:, :1]).abs() / scale
    best = errors.argmin(dim=1)
    if float(errors.gather(1, best[:, None]).max()) > LOGITS_TOLERANCE:
        return None
    images = [int(j) for j in best]
    return None if images == list(range(len(images))) else images


def paired_as_used(steps: Sequence[StepLogits], temperature: float) -> list[StepLogits] | None:
    """``steps`` with each query paired with the key its positive logit used, when in some
    step those are other images' keys (``positive_images``); None when in none."""
    paired, moved = [], False
    for step in steps:
        images = positive_images(step, temperature)
        moved |= images is not None
        paired.append(step if images is None else replace(step, k=step.k[images]))
    return paired if moved else None


def identify_logits_form(
    steps: Sequence[StepLogits], temperature: float, *, tolerance: float = LOGITS_TOLERANCE
) -> LogitsFit:
    """The form explaining the most steps at ``temperature`` (ties: the smaller summed error,
    then the fewest differences from the reference); if none explains every step, the best
    dividing form at a fitted T, when that explains more."""
    def score(errors: list[float], form: LossForm):
        return (sum(e <= tolerance for e in errors), -sum(min(e, 10.0) for e in errors),
                -len(form.differences()))

    evaluated = [(form, form_errors(form, steps, temperature)) for form in candidate_forms()]
    form, errors = max(evaluated, key=lambda pair: score(pair[1], pair[0]))
    best = LogitsFit(form, temperature, errors, tolerance)
    if best.all_match:
        return best
    for candidate in candidate_forms():
        if candidate.temperature != "divide":
            continue
        t = fit_temperature(candidate, steps)
        if t is not None:
            t = float(f"{t:.6g}")
            fitted = LogitsFit(candidate, t, form_errors(candidate, steps, t), tolerance, True)
            if score(fitted.errors, candidate) > score(best.errors, best.form):
                best = fitted
        if best.all_match:
            continue
        apart = _apart_temperatures(candidate, steps, temperature)
        if apart is not None:
            form, t = apart
            fitted = LogitsFit(form, t, form_errors(form, steps, t), tolerance, t != temperature)
            if score(fitted.errors, form) > score(best.errors, best.form):
                best = fitted
    return best


def _apart_temperatures(form: LossForm, steps: Sequence[StepLogits],
                        temperature: float) -> tuple[LossForm, float] | None:
    """``(form with positive_t, the negatives' T)``: the positive column and the negative
    columns each divided by a T of its own, fitted in closed form on each (the given T kept
    where it fits); None when either cannot be fitted or they agree."""
    fitted = [fit_temperature(form, steps, columns) for columns in (slice(0, 1), slice(1, None))]
    if None in fitted:
        return None
    t_positive, t_negatives = (float(f"{t:.4g}") for t in fitted)
    if math.isclose(t_negatives, temperature, rel_tol=1e-3):
        t_negatives = temperature
    if math.isclose(t_positive, t_negatives, rel_tol=1e-3):
        return None
    return replace(form, positive_t=t_positive), t_negatives
