"""Which loss each step computed.

``identify_loss_form`` fits one form to the whole run. A rule that changes with the queue
(the mask applied only once the queue is full, the in-batch branch used until it is) fits no
single form; here every step the fitted form does not explain is fitted on its own, by the
single changes of the fitted form and of the reference's form, so the verdict reads "steps
0–3: the reference loss; steps 4–11: no same-source mask" and each invariant is judged on
its own factor at the steps it concerns. A step no candidate explains stays unexplained, and
``departure`` says which columns of its logits the observed gradient leaves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from moco_ref.core.contrastive import same_source_mask
from moco_ref.judge.invariants.loss import (
    FORM_CHOICES,
    PARAMETER_TEXT,
    REFERENCE_FORM,
    FormFit,
    LossForm,
    StepLossInputs,
    form_gradient,
    form_parts,
    gradient_error,
)
from moco_ref.judge.loss_story import story_run, story_text
from moco_ref.probe.threads import one_thread


@dataclass(frozen=True)
class StepLoss:
    """The form that explains one step (None: none does), with its error and loss value."""

    form: LossForm | None
    error: float
    loss: float | None


@dataclass
class LossDiagnosis:
    fit: FormFit  # the one form fitted over every step
    steps: list[StepLoss]

    @property
    def tolerance(self) -> float:
        return self.fit.tolerance

    @property
    def temperature(self) -> float:
        return self.fit.temperature

    @property
    def unexplained(self) -> list[int]:
        return [t for t, s in enumerate(self.steps) if s.form is None]

    @property
    def all_explained(self) -> bool:
        return bool(self.steps) and not self.unexplained

    def form_at(self, t: int) -> LossForm | None:
        return self.steps[t].form

    def steps_where(self, factor: str, values: Sequence[str], among=None) -> list[int]:
        """The explained steps (of ``among``, default all) whose form has ``factor`` in
        ``values``."""
        chosen = range(len(self.steps)) if among is None else among
        return [t for t in chosen
                if self.steps[t].form is not None
                and getattr(self.steps[t].form, factor) in values]

    def runs(self) -> list[tuple[int, int, LossForm | None]]:
        """``(first, last, form)`` for each run of consecutive steps explained alike."""
        runs: list[tuple[int, int, LossForm | None]] = []
        for t, step in enumerate(self.steps):
            if runs and runs[-1][2] == step.form and runs[-1][1] == t - 1:
                runs[-1] = (runs[-1][0], t, step.form)
            else:
                runs.append((t, t, step.form))
        return runs

    def narrative(self, context=None, limit: int = 4) -> str:
        """``steps 0–3: the reference loss; steps 4–11 (the queue holding 240 keys): no
        same-source mask``; ``context(t)`` adds what was special about a run's first step."""
        return story_text(self.story(context), limit)

    def story(self, context=None) -> dict:
        """The runs as data, each departure with its check (``loss_story``)."""
        return {"runs": [story_run(first, last, form_parts(form) if form is not None else [],
                                   context(first) if context is not None and first > 0 else "",
                                   explained=form is not None)
                         for first, last, form in self.runs()]}

    def pass_story(self, context=None) -> dict:
        """The story the loss check's pass message tells: one run of the fitted form when it
        explains every step alike."""
        if len(self.runs()) == 1:
            return {"runs": [story_run(0, len(self.steps) - 1, form_parts(self.fit.form))]}
        return self.story(context)


def candidate_forms(base: LossForm) -> list[LossForm]:
    """Every form one choice away from ``base`` or from the reference's form."""
    seen, forms = set(), []
    for origin in (base, REFERENCE_FORM):
        for name, choices in FORM_CHOICES.items():
            for choice in choices:
                form = replace(origin, **{name: choice})
                if form not in seen:
                    seen.add(form)
                    forms.append(form)
    return forms


def diagnose_loss(steps: Sequence[StepLossInputs], fit: FormFit) -> LossDiagnosis:
    """Each step explained by the fitted form where it matches, otherwise by the closest
    candidate within the fit's tolerance, otherwise by none; an explaining form is reduced to
    what that step can tell apart (the labels of the queue branch say nothing at an
    empty-queue step), so a fault is charged only at the steps that show it."""
    with one_thread():
        verdicts = []
        for t, step in enumerate(steps):
            if fit.matched[t]:
                form = _simplest(step, fit.form, fit, origins=(REFERENCE_FORM,))
                verdicts.append(StepLoss(form, fit.errors[t], fit.losses[t]))
            else:
                verdicts.append(_explain_step(step, fit))
        return LossDiagnosis(fit, verdicts)


def _explain_step(step: StepLossInputs, fit: FormFit) -> StepLoss:
    best: tuple[float, LossForm | None, float | None] = (math.inf, None, None)
    for form in candidate_forms(fit.form):
        result = form_gradient(form, step, fit.temperature)
        if result is None:
            continue
        error = gradient_error(step.grad, result[1])
        if error < best[0]:
            best = (error, form, result[0])
    error, form, loss = best
    if form is None or error > fit.tolerance:
        return StepLoss(None, error, None)
    return StepLoss(_simplest(step, form, fit), error, loss)


def _simplest(step: StepLossInputs, form: LossForm, fit: FormFit, origins=None) -> LossForm:
    """``form`` with every choice that makes no difference at this step put back to the
    fitted form's, then to the reference's."""
    for origin in origins or (fit.form, REFERENCE_FORM):
        if origin == form:
            continue
        for name in (*FORM_CHOICES, *PARAMETER_TEXT):
            simpler = replace(form, **{name: getattr(origin, name)})
            if simpler == form:
                continue
            result = form_gradient(simpler, step, fit.temperature)
            if result is not None and gradient_error(step.grad, result[1]) <= fit.tolerance:
                form = simpler
    return form


def departure(step: StepLossInputs, form: LossForm, temperature: float) -> str:
    """Where the observed dL/dq leaves ``form``'s at this step, by the columns of the logits
    its difference lies along: the positive key, the same-source negatives, or the others."""
    result = form_gradient(form, step, temperature)
    if result is None or step.grad is None:
        return "the gradient cannot be compared"
    residual = (step.grad.to(torch.float64) - result[1])  # [B, d]
    keys, ids = step.negatives.get(form.negatives, step.negatives["before"])
    k = F.normalize(step.k.to(torch.float64), dim=1)
    q = F.normalize(step.z.to(torch.float64), dim=1)
    same = same_source_mask(step.ids, ids)  # [B, n]
    shares = {"the positive": 0.0, "the same-source negatives": 0.0, "the other negatives": 0.0}
    for i in range(len(residual)):
        r = residual[i]
        total = float(r.norm())
        if total <= 1e-15:
            continue
        along_positive = _explained(r, k[i:i + 1], q[i])
        along_same = _explained(r, keys[same[i]], q[i]) if bool(same[i].any()) else 0.0
        shares["the positive"] += along_positive
        shares["the same-source negatives"] += max(along_same - along_positive, 0.0)
        shares["the other negatives"] += max(1.0 - max(along_positive, along_same), 0.0)
    where = max(shares, key=shares.get)
    return f"the difference lies mostly along {where}"


def _explained(vector: torch.Tensor, basis: torch.Tensor, q: torch.Tensor) -> float:
    """The share of ``vector``'s squared norm in the span of ``basis``'s rows, each taken
    orthogonal to ``q`` (a gradient through ``normalize(z)`` has no component along q)."""
    basis = basis.to(torch.float64)
    basis = basis - (basis @ q)[:, None] * q[None, :]
    solution = torch.linalg.lstsq(basis.T, vector.unsqueeze(1)).solution  # [m, 1]
    projected = (basis.T @ solution).squeeze(1)
    return float(projected.norm() ** 2 / vector.norm() ** 2)
