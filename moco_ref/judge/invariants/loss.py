"""I4, I8 and I9 on plain tensors: the InfoNCE loss of one step in the reference's form and in
the forms of known mistakes, its gradient w.r.t. the query's raw projection ``z``, and the
form that explains an observed gradient.

A *form* fixes eight independent choices; the reference's form is the first of each:

======================  ====================================================================
``temperature``         with a non-empty queue: ``divide`` (logits / T) · ``multiply``
                        (logits · T) · ``positive-undivided`` (only the negatives divided) ·
                        ``negatives-undivided`` (only the positive divided) · ``none`` ·
                        ``twice`` (logits / T²)
``warmup_temperature``  the same, in the in-batch branch
``normalize``           ``both`` · ``q-raw`` (q not L2-normalized) · ``k-raw`` · ``k-batch``
                        (k normalized over the batch, dim=0) · ``q-batch`` (q so) ·
                        ``k-matrix`` (k divided by the whole matrix's norm, ``k / k.norm()``)
``mask``                ``same-source`` · ``none`` · ``positive-too`` (the positive hidden as
                        well) · ``inverted`` (every other source hidden, ``!=`` for ``==``) ·
                        ``fill-zero`` (same-source logits set to 0, which still counts) ·
                        ``rows-zero`` (the queue rows of any query's image zeroed: their
                        logit 0 for every query, still counted)
``negatives``           ``before`` (the queue before this step's enqueue) · ``after`` (the
                        batch's own keys enqueued before the loss) · ``with-current`` (the
                        batch's keys appended to the queue, nothing dropped) · ``recomputed``
                        (the queue re-encoded now) · ``with-empty-slots`` (a preallocated
                        queue's unfilled zero slots among the negatives once it holds a key)
                        · ``zero-initialized`` (the same from the first step: a queue that
                        starts as ``capacity`` zero rows, so no step is a warm-up)
``empty_queue``         ``in-batch`` (q·kᵀ/T, labels arange) · ``in-batch-zero-labels`` ·
                        ``positive-only`` (no warm-up branch: one logit per row, loss 0) ·
                        ``symmetric`` (the in-batch loss averaged with its transpose's,
                        k·qᵀ/T, each key's query as its label)
``branch``              ``by-queue`` (the in-batch branch only while the queue is empty) ·
                        ``in-batch`` (in-batch negatives at this step although the queue
                        holds keys)
``labels``              ``zeros`` (the positive at column 0) · ``ones`` (column 1) ·
                        ``arange`` (query i told column i) · ``last`` (the newest queued key)
``reduction``           ``mean`` over the batch · ``sum``
``denominator``         ``all`` · ``negatives-only`` (the positive left out of the softmax's
                        denominator, with a non-empty queue)
``extra``               ``none`` · ``queries`` (the batch's other queries appended as
                        negatives, q·qᵀ with the query's own column hidden)
``scores``              ``logits`` · ``softmax`` (softmax probabilities handed to
                        ``cross_entropy``, which applies its own softmax: a double softmax)
======================  ====================================================================

Five more choices are numbers, fitted when no combination of the above explains every step
(``None``: the reference's): ``queue_t`` and ``warmup_t``, the divisor of one branch's logits
when it is not the T of the other (one branch divided by another temperature, or scaled by a
constant); ``scale``, a constant the loss is multiplied by (divided by a count); ``newest``,
how many of the newest queued keys serve as negatives when not all of them do;
``positive_t``, the positive logit's divisor when it is not the negatives' (fitted on a
builder module's returned logits, ``logits.py``).

A form is fitted over all steps, and where it does not explain a step, per step
(``loss_diagnosis``): a rule that changes with the queue (the mask only once the queue is
full, the in-batch branch until it is) shows as one form for some steps and another for the
rest.

The reference's form is computed by the reference (``contrastive_logits``,
``in_batch_logits``, ``info_nce_loss``); a mistaken form is the reference's computation with
one input changed (T → 1/T, no ids, …) or one column replaced.

Long on purpose: the forms, their gradient and the search that fits them (the choices one at
a time, then T, then the numeric choices) share ``LossForm`` and one cached scorer; apart, the
search would reach into the gradient's internals from another module.
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
    same_source_mask,
)
from moco_ref.judge.loss_story import (  # noqa: F401 - the owners are named here too
    FACTOR_OWNERS,
    LOSS_CHECK_ID,
    REFERENCE_TEXT,
    VALUE_OWNERS,
    owner_of,
)
from moco_ref.probe.threads import one_thread

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
    branch: str = "by-queue"
    labels: str = "zeros"
    reduction: str = "mean"
    denominator: str = "all"
    extra: str = "none"
    scores: str = "logits"
    queue_t: float | None = None  # the queue branch's divisor, when not the given T
    warmup_t: float | None = None  # the in-batch branch's divisor, when not the given T
    scale: float | None = None  # the loss multiplied by this
    newest: int | None = None  # only the newest this many queued keys are negatives
    positive_t: float | None = None  # the positive's divisor, when not the negatives' T
    smoothing: float | None = None  # cross_entropy's label_smoothing ε

    def differences(self) -> dict[str, str | float | int]:
        """``{factor: value}`` for every choice that is not the reference's."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(REFERENCE_FORM, f.name)
        }

    def describe(self) -> str:
        return "; ".join(text for _, text in form_parts(self)) or REFERENCE_TEXT


def form_parts(form: LossForm) -> list[tuple[str, str]]:
    """``(owner check, text)`` for each way ``form`` departs from the reference."""
    return [(owner_of(name, value), PARAMETER_TEXT[name](value) if name in PARAMETER_TEXT
             else FORM_TEXT[(name, value)]) for name, value in form.differences().items()]


def divisor_text(value: float) -> str:
    return f"{value:.4g}"


PARAMETER_TEXT = {
    "queue_t": lambda v: f"the queue branch's logits divided by {divisor_text(v)} instead of T",
    "warmup_t": lambda v: f"the in-batch (warm-up) branch's logits divided by {divisor_text(v)} "
                          "instead of T",
    "scale": lambda v: f"the loss multiplied by {v:.4g} (divided by {1 / v:.4g})",
    "smoothing": lambda v: f"cross_entropy with label_smoothing={v:.3g} (a share of the "
                           "target spread over every column, negatives included)",
    "newest": lambda v: f"only the newest {v} queued keys used as negatives",
    "positive_t": lambda v: f"the positive divided by {divisor_text(v)}, not by the negatives' "
                            "temperature",
}


REFERENCE_FORM = LossForm()
TEMPERATURE_RULES = ("divide", "multiply", "positive-undivided", "negatives-undivided", "none",
                     "twice")
FORM_CHOICES: dict[str, tuple[str, ...]] = {
    "temperature": TEMPERATURE_RULES,
    "warmup_temperature": TEMPERATURE_RULES,
    "normalize": ("both", "q-raw", "k-raw", "k-batch", "q-batch", "k-matrix"),
    "mask": ("same-source", "none", "positive-too", "inverted", "fill-zero", "rows-zero",
             "ids-bfloat16"),
    "negatives": ("before", "after", "with-current", "recomputed", "with-empty-slots",
                  "zero-initialized"),
    "empty_queue": ("in-batch", "in-batch-zero-labels", "positive-only", "symmetric"),
    "branch": ("by-queue", "in-batch"),
    "labels": ("zeros", "ones", "arange", "last"),
    "reduction": ("mean", "sum"),
    "denominator": ("all", "negatives-only"),
    "extra": ("none", "queries"),
    "scores": ("logits", "softmax"),
}
FORM_TEXT: dict[tuple[str, str], str] = {
    ("temperature", "divide"): "logits divided by T",
    ("temperature", "multiply"): "logits multiplied by T instead of divided",
    ("temperature", "positive-undivided"): "only the negatives divided by T, not the positive",
    ("temperature", "negatives-undivided"): "only the positive divided by T, not the negatives",
    ("temperature", "none"): "logits not divided by T",
    ("temperature", "twice"): "logits divided by T twice (by T²)",
    ("warmup_temperature", "divide"): "in-batch logits divided by T",
    ("warmup_temperature", "multiply"): "in-batch logits multiplied by T instead of divided",
    ("warmup_temperature", "positive-undivided"): "in-batch positives not divided by T",
    ("warmup_temperature", "negatives-undivided"): "in-batch negatives not divided by T",
    ("warmup_temperature", "none"): "in-batch logits not divided by T",
    ("warmup_temperature", "twice"): "in-batch logits divided by T twice (by T²)",
    ("normalize", "both"): "q and k L2-normalized",
    ("normalize", "q-raw"): "q not L2-normalized",
    ("normalize", "k-raw"): "k not L2-normalized",
    ("normalize", "k-batch"): "k normalized over the batch (dim=0), not each key",
    ("normalize", "k-matrix"): "k divided by the norm of the whole batch matrix (k / k.norm()), "
                               "not each key by its own",
    ("normalize", "q-batch"): "q normalized over the batch (dim=0), not each query",
    ("mask", "same-source"): "same-source negatives masked",
    ("mask", "none"): "no same-source mask",
    ("mask", "positive-too"): "the positive masked along with the same-source negatives",
    ("mask", "inverted"): "the mask inverted: every other-source negative hidden and the "
                          "same-source ones kept (compared with != instead of ==)",
    ("mask", "fill-zero"): "same-source logits set to 0 instead of −∞ (e^0 still counts)",
    ("mask", "rows-zero"): "same-source queue rows zeroed instead of their logits masked: a "
                           "logit of 0 (e^0 still counts) for every query of the batch",
    ("mask", "ids-bfloat16"): "the mask compares ids kept in bfloat16 (integers exact only up "
                              "to 256): other images' keys whose ids round alike are masked too",
    ("negatives", "before"): "negatives from the queue before this batch",
    ("negatives", "after"): "the batch's own keys among the negatives (enqueued before the loss)",
    ("negatives", "with-current"): "the batch's own keys appended to the queue's negatives",
    ("negatives", "recomputed"): "negatives re-encoded with the current key encoder",
    ("negatives", "with-empty-slots"): "the queue's unfilled (zero) slots used as negatives "
                                       "until it is full: a logit of 0 each, still counted",
    ("negatives", "zero-initialized"): "a queue that starts as capacity zero rows, used whole "
                                       "from the first step: its unfilled slots are negatives "
                                       "(a logit of 0 each) and no step is a warm-up",
    ("empty_queue", "in-batch"): "in-batch negatives, labels arange(B), while the queue is empty",
    ("empty_queue", "in-batch-zero-labels"): "in-batch logits with labels all 0 (empty queue)",
    ("empty_queue", "positive-only"): "no warm-up branch: with an empty queue each row has only "
    "its positive and the loss is 0",
    ("empty_queue", "symmetric"): "a symmetric warm-up loss: the in-batch cross-entropy averaged "
                                  "with that of its transpose (each key told its own query)",
    ("branch", "by-queue"): "the in-batch branch only while the queue is empty",
    ("branch", "in-batch"): "in-batch negatives (the warm-up branch) although the queue holds "
                            "keys",
    ("labels", "zeros"): "labels zeros(B): the positive at column 0",
    ("labels", "ones"): "labels ones(B): column 1 (the oldest queued key) taken for the positive",
    ("labels", "arange"): "labels arange(B) with the queue: query i told its positive is column "
                          "i (a queued key for i > 0), not column 0",
    ("labels", "last"): "labels pointing at the last column (the newest queued key), not at the "
                        "positive in column 0",
    ("reduction", "mean"): "the loss averaged over the batch",
    ("reduction", "sum"): "the loss summed over the batch instead of averaged",
    ("scores", "logits"): "cross_entropy given the logits",
    ("scores", "softmax"): "softmax probabilities handed to cross_entropy, which applies its "
                           "own softmax: a double softmax, −ln softmax(softmax(logits))[label]",
    ("denominator", "all"): "the positive in the softmax denominator",
    ("denominator", "negatives-only"): "the positive left out of the softmax denominator "
                                       "(−log e^(q·k⁺/T) / Σ_neg e^(q·n/T))",
    ("extra", "none"): "only the queue's keys as negatives",
    ("extra", "queries"): "the batch's other queries appended as extra negatives (q·qᵀ/T)",
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


def _divisor(rule: str, temperature: float) -> float:
    """What the (negative) logits are divided by under a temperature rule."""
    return {"multiply": 1.0 / temperature, "twice": temperature * temperature,
            "none": 1.0, "negatives-undivided": 1.0}.get(rule, temperature)


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
    if negatives.shape[0] == 0 or form.branch == "in-batch":
        t = temperature if form.warmup_t is None else form.warmup_t
        return _in_batch_form(form, q, k, positive, ids, t)
    if form.queue_t is not None:
        temperature = form.queue_t
    rule = form.temperature
    if form.mask in ("same-source", "positive-too"):
        logits = contrastive_logits(q, k, negatives, negative_ids, ids, _divisor(rule, temperature))
    elif form.mask == "ids-bfloat16":
        logits = contrastive_logits(q, k, negatives, _as_bfloat16(negative_ids), _as_bfloat16(ids),
                                    _divisor(rule, temperature))
    else:
        logits = contrastive_logits(q, k, negatives, None, None, _divisor(rule, temperature))
    if form.mask in ("fill-zero", "inverted", "rows-zero"):
        same = same_source_mask(ids, negative_ids)  # [B, n]
        if form.mask == "rows-zero":  # a row zeroed for one query is zero for all
            same = same.any(dim=0, keepdim=True).expand_as(same)
        hidden, value = (~same, -math.inf) if form.mask == "inverted" else (same, 0.0)
        logits = torch.cat([logits[:, :1], logits[:, 1:].masked_fill(hidden, value)], dim=1)
    if rule in ("positive-undivided", "negatives-undivided"):
        divided = positive if rule == "positive-undivided" else positive / temperature
        logits = torch.cat([divided, logits[:, 1:]], dim=1)
    if form.positive_t is not None:
        logits = torch.cat([positive / form.positive_t, logits[:, 1:]], dim=1)
    if form.mask == "positive-too":
        logits = torch.cat([torch.full_like(positive, MASKED_POSITIVE), logits[:, 1:]], dim=1)
    if form.extra == "queries":
        others = (q @ q.T / _divisor(rule, temperature)).masked_fill(
            torch.eye(len(q), dtype=torch.bool, device=q.device), -math.inf)
        logits = torch.cat([logits, others], dim=1)
    labels = positive_labels(len(q), q.device)
    if form.labels == "ones":
        labels = labels + 1
    elif form.labels == "arange":
        labels = torch.arange(len(q), device=q.device)
    elif form.labels == "last":
        labels = labels + logits.shape[1] - 1
    return logits, labels


def _as_bfloat16(ids: torch.Tensor) -> torch.Tensor:
    """Source ids as a submission that keeps them in bfloat16 compares them (rounded)."""
    return ids.to(torch.bfloat16).to(torch.int64)


def _in_batch_form(form, q, k, positive, ids, temperature):
    rule = form.warmup_temperature
    t = _divisor(rule, temperature)
    masking = form.mask != "none"
    if form.empty_queue == "positive-only" and form.branch != "in-batch":
        logits = positive if rule == "positive-undivided" else positive / t
        return logits, positive_labels(len(q), q.device)
    logits, labels = in_batch_logits(q, k, t, ids if masking else None)  # [B, B]
    if rule in ("positive-undivided", "negatives-undivided"):
        eye = torch.eye(len(q), dtype=torch.bool, device=q.device)
        divided = positive if rule == "positive-undivided" else positive / temperature
        logits = torch.where(eye, divided.expand_as(logits), logits)
    if form.empty_queue == "in-batch-zero-labels":
        labels = torch.zeros_like(labels)
    return logits, labels


def normalized_pair(form: LossForm, z: torch.Tensor, k: torch.Tensor):
    """``(q, k)`` as ``form`` normalizes the raw projections ``[B, d]``: the reference puts
    each row at unit L2 norm; the mistaken forms leave one raw or normalize over the batch."""
    q = z if form.normalize == "q-raw" else F.normalize(
        z, dim=0 if form.normalize == "q-batch" else 1)
    if form.normalize == "k-matrix":
        k = k / k.norm()
    elif form.normalize != "k-raw":
        k = F.normalize(k, dim=0 if form.normalize == "k-batch" else 1)
    return q, k


def form_gradient(
    form: LossForm, step: StepLossInputs, temperature: float
) -> tuple[float, torch.Tensor] | None:
    """``(loss, dL/dz [B, d])`` of ``form`` at ``step`` in float64; None when the form needs a
    dictionary the step does not have."""
    if form.negatives not in step.negatives:
        return None
    z = step.z.detach().to(torch.float64).clone().requires_grad_(True)
    q, k = normalized_pair(form, z, step.k.detach().to(torch.float64))
    keys, key_ids = step.negatives[form.negatives]
    if form.newest is not None and form.newest < len(keys):
        keys, key_ids = keys[len(keys) - form.newest:], key_ids[len(keys) - form.newest:]
    logits, labels = form_logits(
        form, q, k, keys.detach().to(torch.float64), key_ids, step.ids, temperature
    )
    if int(labels.max()) >= logits.shape[1] or (form.labels == "last" and logits.shape[1] < 3):
        return None  # labels past the last column: no such loss; with 2 columns last is ones
    if form.scores == "softmax":
        logits = logits.softmax(dim=1)
    if form.denominator == "negatives-only" and keys.shape[0] and form.branch != "in-batch":
        rows = torch.arange(len(logits))
        label_logit = logits[rows, labels]
        others = logits.masked_fill(F.one_hot(labels, logits.shape[1]).bool(), -math.inf)
        loss = (others.logsumexp(dim=1) - label_logit).mean()
    elif form.empty_queue == "symmetric" and (keys.shape[0] == 0 or form.branch == "in-batch"):
        loss = (info_nce_loss(logits, labels) + info_nce_loss(logits.T, labels)) / 2
    else:
        loss = info_nce_loss(logits, labels)
    if form.smoothing is not None:  # torch's label_smoothing: (1 − ε)·CE + ε·mean_j(−ln p_j)
        spread = -F.log_softmax(logits, dim=1).mean(dim=1).mean()
        loss = (1.0 - form.smoothing) * loss + form.smoothing * spread
    if form.reduction == "sum":
        loss = loss * len(logits)
    if form.scale is not None:
        loss = loss * form.scale
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
        base, improved = best, False
        for name, choices in FORM_CHOICES.items():
            for choice in choices:
                candidate = replace(base, **{name: choice})  # one change from this round's base
                if candidate == base:
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
    if fit_temperature and scorer.score(best, fitted_t, tolerance)[0] < len(steps):
        best = _fit_parameters(scorer, best, fitted_t, tolerance)
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


def _fit_parameters(scorer: _FormScorer, form: LossForm, temperature: float,
                    tolerance: float) -> LossForm:
    """``form`` with the numeric choice (one branch's divisor, a scale on the loss, the newest
    n queued keys) that explains the most steps, when one explains more than ``form`` does."""
    candidates = [_branch_temperatures(scorer, form, temperature, tolerance),
                  _constant_scale(scorer, form, temperature),
                  _label_smoothing(scorer, form, temperature),
                  _newest_negatives(scorer, form, temperature, tolerance)]
    best, best_score = form, scorer.score(form, temperature, tolerance)
    for candidate in candidates:
        if candidate is None:
            continue
        score = scorer.score(candidate, temperature, tolerance)
        if score > best_score:
            best, best_score = candidate, score
    return best


def _in_batch_step(form: LossForm, step: StepLossInputs) -> bool:
    negatives = step.negatives.get(form.negatives)
    return form.branch == "in-batch" or negatives is None or negatives[0].shape[0] == 0


def _branch_temperatures(scorer: _FormScorer, form: LossForm, temperature: float,
                         tolerance: float) -> LossForm | None:
    """Each branch's divisor fitted on its own steps (a branch the given T explains keeps it)."""
    divided = replace(form, temperature="divide", warmup_temperature="divide")
    fitted = {}
    for name, in_batch in (("queue_t", False), ("warmup_t", True)):
        steps = [s for s in scorer.steps if _in_batch_step(divided, s) == in_batch]
        if not steps:
            continue
        sub = _FormScorer(steps)
        if sub.score(divided, temperature, tolerance)[0] == len(steps):
            continue
        t = _fit_temperature(sub, divided, tolerance)
        if t is None:
            return None
        if not math.isclose(t, temperature, rel_tol=1e-3):
            fitted[name] = float(f"{t:.4g}")
    return replace(divided, **fitted) if fitted else None


def _constant_scale(scorer: _FormScorer, form: LossForm, temperature: float) -> LossForm | None:
    """``form`` times the one constant its gradient is off by at every step (least squares per
    step, the same within 1% at all), or None."""
    scales = []
    for step in scorer.steps:
        result = form_gradient(form, step, temperature)
        if result is None or step.grad is None:
            return None
        expected, observed = result[1], step.grad.to(torch.float64)
        norm = float((expected * expected).sum())
        if norm <= 1e-24:
            continue
        scales.append(float((observed * expected).sum()) / norm)
    if not scales or min(scales) <= 0:
        return None
    scale = sorted(scales)[len(scales) // 2]
    if any(abs(s / scale - 1) > 0.01 for s in scales) or abs(scale - 1) <= 0.01:
        return None
    count = round(1 / scale)
    if count >= 2 and abs(count * scale - 1) <= 1e-3:
        scale = 1 / count
    return replace(form, scale=float(f"{scale:.6g}"))


def _label_smoothing(scorer: _FormScorer, form: LossForm, temperature: float) -> LossForm | None:
    """``form`` with cross_entropy's ``label_smoothing`` ε: the gradient is linear in ε,
    ``(1 − ε)·g(CE) + ε·g(spread)``, so ε is fitted per step in closed form and must be one
    value (within 1%) at every step; None otherwise."""
    smoothed = []
    for step in scorer.steps:
        plain = form_gradient(replace(form, smoothing=0.0), step, temperature)
        spread = form_gradient(replace(form, smoothing=1.0), step, temperature)
        if plain is None or spread is None or step.grad is None:
            return None
        direction = spread[1] - plain[1]
        norm = float((direction * direction).sum())
        if norm <= 1e-24:
            continue
        residual = step.grad.to(torch.float64) - plain[1]
        smoothed.append(float((residual * direction).sum()) / norm)
    if not smoothed:
        return None
    epsilon = sorted(smoothed)[len(smoothed) // 2]
    if not 0.001 <= epsilon < 1 or any(abs(e - epsilon) > 0.01 * epsilon for e in smoothed):
        return None
    return replace(form, smoothing=float(f"{epsilon:.4g}"))


def _newest_negatives(scorer: _FormScorer, form: LossForm, temperature: float,
                      tolerance: float) -> LossForm | None:
    """``form`` with only the newest n queued keys as negatives, n found at the first step
    ``form`` does not explain (every n below what the queue holds there), or None."""
    errors, _ = scorer.evaluate(form, temperature)
    for step, error in zip(scorer.steps, errors):
        if error <= tolerance or _in_batch_step(form, step):
            continue
        held = step.negatives[form.negatives][0].shape[0]
        best = (math.inf, None)
        for n in range(1, held):
            result = form_gradient(replace(form, newest=n), step, temperature)
            if result is not None:
                best = min(best, (gradient_error(step.grad, result[1]), n), key=lambda p: p[0])
        return replace(form, newest=best[1]) if best[0] <= tolerance else None
    return None
