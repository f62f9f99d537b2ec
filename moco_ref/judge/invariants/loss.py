"""I4, I8 and I9 on plain tensors: the InfoNCE loss of one step in the reference's form and in
the forms of known mistakes, its gradient w.r.t. the query's raw projection ``z``, and the
form that explains an observed gradient.

A *form* fixes five independent choices; the reference's form is the first of each:

================  ==========================================================================
``temperature``   with a non-empty queue: ``divide`` (logits / T) · ``multiply`` (logits · T) ·
                  ``positive-undivided`` (only the negatives are divided by T)
``warmup_temperature``  the same three, in the in-batch branch (an empty queue)
``normalize``     ``both`` · ``q-raw`` (q not L2-normalized) · ``k-raw`` (k not normalized)
``mask``          ``same-source`` · ``none`` (no same-source mask) · ``positive-too`` (the mask
                  also hides the positive)
``negatives``     ``before`` (the queue before this step's enqueue) · ``after`` (the batch's own
                  keys enqueued before the loss) · ``recomputed`` (the queue re-encoded now)
``empty_queue``   ``in-batch`` (q·kᵀ/T, labels arange) · ``in-batch-zero-labels`` ·
                  ``positive-only`` (no warm-up branch: one logit per row, loss 0)
================  ==========================================================================

The reference's form is computed by the reference (``contrastive_logits``,
``in_batch_logits``, ``info_nce_loss``); a mistaken form is the reference's computation with
one input changed (T → 1/T, no ids, …) or one column replaced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import torch
import torch.nn.functional as F

from moco_ref.core.contrastive import (
    contrastive_logits,
    in_batch_logits,
    info_nce_loss,
    positive_labels,
)
from moco_ref.observe.threads import one_thread

GRADIENT_TOLERANCE = 2e-3  # max-abs error relative to the gradient's largest entry
MASKED_POSITIVE = -1e9  # a finite stand-in: a −inf label logit has no finite loss


@dataclass(frozen=True)
class LossForm:
    temperature: str = "divide"
    warmup_temperature: str = "divide"
    normalize: str = "both"
    mask: str = "same-source"
    negatives: str = "before"
    empty_queue: str = "in-batch"

    def differences(self) -> dict[str, str]:
        """``{factor: value}`` for every choice that is not the reference's."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(REFERENCE_FORM, f.name)
        }

    def describe(self) -> str:
        changed = self.differences()
        if not changed:
            return "the reference loss"
        return "; ".join(FORM_TEXT[(name, value)] for name, value in changed.items())


REFERENCE_FORM = LossForm()
FORM_CHOICES: dict[str, tuple[str, ...]] = {
    "temperature": ("divide", "multiply", "positive-undivided"),
    "warmup_temperature": ("divide", "multiply", "positive-undivided"),
    "normalize": ("both", "q-raw", "k-raw"),
    "mask": ("same-source", "none", "positive-too"),
    "negatives": ("before", "after", "recomputed"),
    "empty_queue": ("in-batch", "in-batch-zero-labels", "positive-only"),
}
FORM_TEXT: dict[tuple[str, str], str] = {
    ("temperature", "divide"): "logits divided by T",
    ("temperature", "multiply"): "logits multiplied by T instead of divided",
    ("temperature", "positive-undivided"): "only the negatives divided by T, not the positive",
    ("warmup_temperature", "divide"): "in-batch logits divided by T",
    ("warmup_temperature", "multiply"): "in-batch logits multiplied by T instead of divided",
    ("warmup_temperature", "positive-undivided"): "in-batch positives not divided by T",
    ("normalize", "both"): "q and k L2-normalized",
    ("normalize", "q-raw"): "q not L2-normalized",
    ("normalize", "k-raw"): "k not L2-normalized",
    ("mask", "same-source"): "same-source negatives masked",
    ("mask", "none"): "no same-source mask",
    ("mask", "positive-too"): "the positive masked along with the same-source negatives",
    ("negatives", "before"): "negatives from the queue before this batch",
    ("negatives", "after"): "the batch's own keys among the negatives (enqueued before the loss)",
    ("negatives", "recomputed"): "negatives re-encoded with the current key encoder",
    ("empty_queue", "in-batch"): "in-batch negatives, labels arange(B), while the queue is empty",
    ("empty_queue", "in-batch-zero-labels"): "in-batch logits with labels all 0 (empty queue)",
    ("empty_queue", "positive-only"): "no warm-up branch: with an empty queue each row has only "
    "its positive and the loss is 0",
}


@dataclass
class StepLossInputs:
    """One step as observed. ``negatives`` maps a ``negatives`` choice to the dictionary the
    loss would use under it: ``(keys [n, d] as stored, ids [n])``."""

    z: torch.Tensor  # [B, d] the query encoder's raw projection
    k: torch.Tensor  # [B, d] the key encoder's raw projection, row i the positive of query i
    ids: torch.Tensor  # [B] source ids
    negatives: dict[str, tuple[torch.Tensor, torch.Tensor]]
    grad: torch.Tensor | None = None  # [B, d] observed dL/dz


def form_logits(
    form: LossForm,
    q: torch.Tensor,
    k: torch.Tensor,
    negatives: torch.Tensor,
    negative_ids: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, labels)`` of ``form`` for (already normalized or not) ``q``, ``k`` ``[B, d]``
    and ``negatives`` ``[n, d]``; an empty dictionary takes the ``empty_queue`` branch."""
    positive = (q * k).sum(dim=1, keepdim=True)  # [B, 1] undivided
    masking = form.mask != "none"
    if negatives.shape[0] == 0:
        rule = form.warmup_temperature
        t = 1.0 / temperature if rule == "multiply" else temperature
        if form.empty_queue == "positive-only":
            logits = positive if rule == "positive-undivided" else positive / t
            return logits, positive_labels(len(q), q.device)
        logits, labels = in_batch_logits(q, k, t, ids if masking else None)  # [B, B]
        if rule == "positive-undivided":
            eye = torch.eye(len(q), dtype=torch.bool, device=q.device)
            logits = torch.where(eye, positive.expand_as(logits), logits)
        if form.empty_queue == "in-batch-zero-labels":
            labels = torch.zeros_like(labels)
        return logits, labels
    t = 1.0 / temperature if form.temperature == "multiply" else temperature
    if masking:
        logits = contrastive_logits(q, k, negatives, negative_ids, ids, t)  # [B, 1 + n]
    else:
        logits = contrastive_logits(q, k, negatives, None, None, t)
    if form.temperature == "positive-undivided":
        logits = torch.cat([positive, logits[:, 1:]], dim=1)
    if form.mask == "positive-too":
        logits = torch.cat([torch.full_like(positive, MASKED_POSITIVE), logits[:, 1:]], dim=1)
    return logits, positive_labels(len(q), q.device)


def form_gradient(
    form: LossForm, step: StepLossInputs, temperature: float
) -> tuple[float, torch.Tensor] | None:
    """``(loss, dL/dz [B, d])`` of ``form`` at ``step`` in float64; None when the form needs a
    dictionary the step does not have."""
    if form.negatives not in step.negatives:
        return None
    z = step.z.detach().to(torch.float64).clone().requires_grad_(True)
    k = step.k.detach().to(torch.float64)
    q = z if form.normalize == "q-raw" else F.normalize(z, dim=1)
    if form.normalize != "k-raw":
        k = F.normalize(k, dim=1)
    keys, key_ids = step.negatives[form.negatives]
    logits, labels = form_logits(
        form, q, k, keys.detach().to(torch.float64), key_ids, step.ids, temperature
    )
    loss = info_nce_loss(logits, labels)
    (grad,) = torch.autograd.grad(loss, z)
    return float(loss.detach()), grad


def gradient_error(observed: torch.Tensor | None, expected: torch.Tensor | None) -> float:
    """Max-abs difference relative to the larger of the two gradients' largest entries
    (0 when both are 0; inf when either is missing)."""
    if observed is None or expected is None or observed.shape != expected.shape:
        return math.inf
    observed, expected = observed.to(torch.float64), expected.to(torch.float64)
    scale = max(float(observed.abs().max()), float(expected.abs().max()))
    if scale <= 1e-12:
        return 0.0
    return float((observed - expected).abs().max()) / scale


@dataclass
class StepwiseFit:
    """A form and temperature with their error at each step; a step matches when its error
    is within the subclass's ``tolerance``."""

    form: LossForm
    temperature: float
    errors: list[float]  # per step, of ``form`` at ``temperature``

    @property
    def matched(self) -> list[bool]:
        return [e <= self.tolerance for e in self.errors]

    @property
    def all_match(self) -> bool:
        return bool(self.errors) and all(self.matched)


@dataclass
class FormFit(StepwiseFit):
    """The form (and temperature) that best explains the observed gradients, step by step."""

    losses: list[float | None]  # per step, of ``form`` at ``temperature``
    tolerance: float = GRADIENT_TOLERANCE
    temperature_fitted: bool = False  # True when no form matched at the given temperature
    evaluated: dict = field(default_factory=dict, repr=False)  # (form, T) -> per-step errors


class _FormScorer:
    def __init__(self, steps: Sequence[StepLossInputs]):
        self.steps = steps
        self.cache: dict[tuple[LossForm, float], tuple[list[float], list[float | None]]] = {}

    def evaluate(self, form: LossForm, temperature: float):
        key = (form, temperature)
        if key not in self.cache:
            errors, losses = [], []
            for step in self.steps:
                result = form_gradient(form, step, temperature)
                if result is None:
                    errors.append(math.inf)
                    losses.append(None)
                else:
                    errors.append(gradient_error(step.grad, result[1]))
                    losses.append(result[0])
            self.cache[key] = (errors, losses)
        return self.cache[key]

    def score(self, form: LossForm, temperature: float, tolerance: float):
        errors, _ = self.evaluate(form, temperature)
        return (sum(e <= tolerance for e in errors), -sum(min(e, 10.0) for e in errors))


def identify_loss_form(
    steps: Sequence[StepLossInputs],
    temperature: float,
    *,
    tolerance: float = GRADIENT_TOLERANCE,
    fit_temperature: bool = True,
) -> FormFit:
    """The form that explains the most steps' observed gradients (ties: the smaller error),
    found by changing one choice at a time from the reference's form. If none explains every
    step at ``temperature``, the temperature itself is fitted for the best form (a
    submission that uses another T is told so instead of being told its loss is wrong)."""
    with one_thread():
        return _identify_loss_form(steps, temperature, tolerance, fit_temperature)


def _identify_loss_form(steps, temperature, tolerance, fit_temperature) -> FormFit:
    scorer = _FormScorer(steps)
    best = REFERENCE_FORM
    best_score = scorer.score(best, temperature, tolerance)
    for _ in range(3):
        if best_score[0] == len(steps):
            break
        improved = False
        for name, choices in FORM_CHOICES.items():
            for choice in choices:
                candidate = replace(best, **{name: choice})
                if candidate == best:
                    continue
                score = scorer.score(candidate, temperature, tolerance)
                if score > best_score:
                    best, best_score, improved = candidate, score, True
        if not improved:
            break
    best = _simplest_equivalent(scorer, best, temperature, tolerance)
    best_score = scorer.score(best, temperature, tolerance)
    fitted_t = temperature
    if fit_temperature and best_score[0] < len(steps):
        divided = replace(best, temperature="divide", warmup_temperature="divide")
        t_fit = _fit_temperature(scorer, divided, tolerance)
        if t_fit is not None:
            candidate = divided
            if scorer.score(candidate, t_fit, tolerance) > best_score:
                best, fitted_t = candidate, t_fit
    errors, losses = scorer.evaluate(best, fitted_t)
    return FormFit(
        form=best,
        temperature=fitted_t,
        errors=errors,
        losses=losses,
        tolerance=tolerance,
        temperature_fitted=fitted_t != temperature,
        evaluated={key: value[0] for key, value in scorer.cache.items()},
    )


def _simplest_equivalent(
    scorer: _FormScorer, form: LossForm, temperature: float, tolerance: float
) -> LossForm:
    """``form`` with every choice that makes no observable difference put back to the
    reference's (e.g. the positive's divisor once the positive is masked anyway)."""
    matched = scorer.score(form, temperature, tolerance)[0]
    for name in form.differences():
        simpler = replace(form, **{name: getattr(REFERENCE_FORM, name)})
        if scorer.score(simpler, temperature, tolerance)[0] >= matched:
            form = simpler
    return form


def _fit_temperature(scorer: _FormScorer, form: LossForm, tolerance: float) -> float | None:
    """The T in [0.01, 10] minimizing the summed error of ``form`` (grid, then golden section)."""

    def total(log_t: float) -> float:
        errors, _ = scorer.evaluate(form, round(math.exp(log_t), 12))
        return sum(min(e, 10.0) for e in errors)

    grid = [math.log(0.01) + i * (math.log(10.0) - math.log(0.01)) / 40 for i in range(41)]
    values = [total(g) for g in grid]
    i = min(range(len(grid)), key=values.__getitem__)
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = total(a), total(b)
    for _ in range(30):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = total(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = total(b)
    best = round(math.exp((lo + hi) / 2.0), 12)
    errors, _ = scorer.evaluate(form, best)
    return best if all(e <= tolerance for e in errors) else None
