"""I6 and I7 on plain tensors: the EMA recurrence θk ← m·θk + (1 − m)·θq fitted to parameter
snapshots, and the step order read off from which θq each update used.

A snapshot is a flat float vector of all parameters ``[P]``; ``segments`` name its pieces
(one per parameter tensor) so a rule that skips some parameters can be named.

Both valid orders make the key encoder that encodes step t's keys
``θk_t = m·θk_{t−1} + (1 − m)·θq_t``, with θq_t the query parameters *at step t* (after
step t − 1's optimizer step): the paper order applies that EMA right after the optimizer
step, the LAB order right before the key forward. The paper order then ends with one more
EMA after the last step; the LAB order does not. An update that uses θq_{t−1}, the query
parameters from *before* the optimizer step, is neither order.

The single-update law is ``momentum_update``'s (``ema_prediction`` calls it); this module only
fits ``m`` and measures residuals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from moco_ref.core.momentum import momentum_update
from moco_ref.probe.threads import one_thread

FLOAT32_EPS = float(torch.finfo(torch.float32).eps)
RELATIVE_TOLERANCE = 0.02  # of the size of the update
NOISE_ULPS = 8.0  # rounding noise allowed, in units of eps·‖θk‖


def ema_prediction(before: torch.Tensor, target: torch.Tensor, m: float) -> torch.Tensor:
    """``m·before + (1 − m)·target`` ``[P]`` computed by the reference ``momentum_update``."""
    key, query = nn.Module(), nn.Module()
    key.theta = nn.Parameter(before.detach().to(torch.float64).clone(), requires_grad=False)
    query.theta = nn.Parameter(target.detach().to(torch.float64).clone(), requires_grad=False)
    momentum_update(key, query, min(max(float(m), 0.0), 1.0))
    return key.theta.detach()


def fit_momentum(
    updates: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> float | None:
    """Least-squares ``m`` over ``(after, before, target)`` triples of ``[P]`` vectors:
    ``after − target = m·(before − target)``. None when no triple carries information
    (every ``before`` equals its ``target``)."""
    numerator = denominator = 0.0
    for after, before, target in updates:
        a = (after.to(torch.float64) - target.to(torch.float64)).flatten()
        b = (before.to(torch.float64) - target.to(torch.float64)).flatten()
        numerator += float(a @ b)
        denominator += float(b @ b)
    if denominator == 0.0:
        return None
    return numerator / denominator


def fits_ema(
    after: torch.Tensor,
    before: torch.Tensor,
    target: torch.Tensor,
    m: float,
    *,
    rtol: float = RELATIVE_TOLERANCE,
    eps: float = FLOAT32_EPS,
) -> tuple[bool, float]:
    """Whether ``after ≈ m·before + (1 − m)·target``, and the residual relative to the size of
    the update (observed or predicted, whichever is larger). Rounding noise of a few ulps of
    ``after`` always fits."""
    after, before, target = (t.to(torch.float64).flatten() for t in (after, before, target))
    predicted = ema_prediction(before, target, m)
    residual = float((after - predicted).norm())
    scale = max(float((after - before).norm()), float((predicted - before).norm()))
    noise = NOISE_ULPS * eps * float(after.norm())
    relative = residual / scale if scale > 0.0 else (0.0 if residual == 0.0 else float("inf"))
    return residual <= max(rtol * scale, noise), relative


@dataclass(frozen=True)
class KeyUpdate:
    """What happened to θk between two key forwards (or between the last one and the end).

    ``previous`` θk at the previous key forward; ``before`` the last snapshot before the update
    (differs from ``previous`` when something other than the EMA moved θk in between);
    ``after`` θk at this key forward (or the returned key encoder when ``final``);
    ``current`` θq at this key forward (after the previous optimizer step); ``stale`` θq at
    the previous key forward (before it). All ``[P]``.
    """

    step: int
    previous: torch.Tensor
    before: torch.Tensor
    after: torch.Tensor
    current: torch.Tensor
    stale: torch.Tensor
    final: bool = False


@dataclass
class UpdateVerdict:
    step: int
    final: bool
    changed: bool  # θk moved at all
    moved_outside: bool  # θk moved between the previous key forward and the EMA
    fits_current: bool
    fits_stale: bool
    residual_current: float
    residual_stale: float
    skipped: list[str] = field(default_factory=list)  # segments the EMA left alone although
    #                                                    θq differed from θk there
    fits_law: bool = True  # with the run's m, all segments, the θq the order uses


@dataclass
class EmaAnalysis:
    """The EMA as observed: which θq it uses, the momentum, the order, each update's verdict."""

    uses: str  # "current" (a valid order), "stale" (θq from before the optimizer step),
    #            "ambiguous" (updates too small to tell), "none" (θk never moved), "unknown"
    m: float | None  # fitted with the θq the updates use
    order: str | None  # "lab" (no EMA after the last step), "paper" (one more), None
    trailing: str  # after the last step: "none", "ema", "stale", "unexplained"
    updates: list[UpdateVerdict]

    @property
    def violations(self) -> list[UpdateVerdict]:
        return [u for u in self.updates if not u.fits_law or u.moved_outside or u.skipped]


def _segment_mask(
    after: torch.Tensor, before: torch.Tensor, segments: Sequence[tuple[str, slice]],
    eps: float = FLOAT32_EPS,
) -> tuple[torch.Tensor, list[str]]:
    """Elements of the segments in which θk moved, and the names of those that did not. A
    segment moved when it changed by more than rounding (``NOISE_ULPS`` ulps of its largest
    entry): a key pulled toward a frozen copy of itself changes by an ulp here and there, and
    that is no EMA step."""
    moved = torch.zeros(after.numel(), dtype=torch.bool)
    still = []
    for name, piece in segments:
        change = (after[piece] - before[piece]).abs()
        scale = float(before[piece].abs().max()) if change.numel() else 0.0
        if not change.numel() or float(change.max()) <= NOISE_ULPS * eps * max(scale, 1e-30):
            still.append(name)
        else:
            moved[piece] = True
    return moved, still


def _skipped(
    u: KeyUpdate, still: Sequence[str], segments: Sequence[tuple[str, slice]], eps: float,
    m: float | None = None, law: str | None = None,
) -> list[str]:
    """The ``still`` segments the EMA should have moved: where the step the law predicts,
    (1 − m)·(θq − θk) — for the θq of the run's ``law`` (current or stale), else for either —
    is larger than rounding. A parameter whose gradient is zero — a conv bias under BatchNorm —
    keeps θq = θk, and the EMA leaves it alone by law; one whose θq barely differs moves by
    less than rounding. (At the first update the stale θq is still θk's copy: judged by the
    stale θq alone, nothing would look skipped there.)"""
    pieces = dict(segments)
    skipped = []
    for name in still:
        piece = pieces[name]
        if piece.stop <= piece.start:
            continue
        noise = NOISE_ULPS * eps * max(float(u.before[piece].abs().max()), 1e-30)
        rate = 1.0 - m if m is not None and 0.0 < m < 1.0 else 1.0
        targets = {"current": (u.current,), "stale": (u.stale,)}.get(law, (u.current, u.stale))
        gaps = [rate * float((target[piece] - u.before[piece]).abs().max())
                for target in targets]
        if min(gaps) > noise:
            skipped.append(name)
    return skipped


def analyse_key_updates(
    updates: Sequence[KeyUpdate],
    segments: Sequence[tuple[str, slice]],
    *,
    eps: float = FLOAT32_EPS,
) -> EmaAnalysis:
    """Fit the EMA to every observed key update; tell which θq it used and which order ran.

    The order is judged only on the parameters the updates moved (so an EMA that skips some
    parameters still shows its order); the law (one ``m`` for every parameter and step, no
    movement outside the EMA, no skipped parameter) is judged on all of them.
    """
    with one_thread():
        return _analyse_key_updates(updates, segments, eps)


def _analyse_key_updates(updates, segments, eps) -> EmaAnalysis:
    inner = [u for u in updates if not u.final]

    def moved_triples(hypothesis: str):
        triples = []
        for u in inner:
            mask, _ = _segment_mask(u.after, u.before, segments, eps)
            if mask.any():
                target = u.current if hypothesis == "current" else u.stale
                triples.append((u.after[mask], u.before[mask], target[mask]))
        return triples

    fitted = {h: fit_momentum(moved_triples(h)) for h in ("current", "stale")}
    verdicts: list[UpdateVerdict] = []
    for u in updates:
        mask, still = _segment_mask(u.after, u.before, segments, eps)
        changed = bool(mask.any())
        fit = {}
        for h in ("current", "stale"):
            target = u.current if h == "current" else u.stale
            m = fitted[h]
            if changed and m is not None:
                fit[h] = fits_ema(u.after[mask], u.before[mask], target[mask], m, eps=eps)
            elif changed:
                fit[h] = (False, float("inf"))
            else:  # no update: fits iff the law predicts none
                fit[h] = fits_ema(u.after, u.before, target, m if m is not None else 1.0, eps=eps)
        verdicts.append(
            UpdateVerdict(
                step=u.step,
                final=u.final,
                changed=changed,
                moved_outside=not torch.equal(u.before, u.previous),
                fits_current=fit["current"][0],
                fits_stale=fit["stale"][0],
                residual_current=fit["current"][1],
                residual_stale=fit["stale"][1],
                skipped=_skipped(u, still, segments, eps,
                                 fitted["current"] if fitted["current"] is not None
                                 else fitted["stale"]) if changed else [],
            )
        )

    inner_verdicts = [v for v in verdicts if not v.final]
    informative = [v for v in inner_verdicts if v.changed or not (v.fits_current and v.fits_stale)]
    current_only = sum(v.fits_current and not v.fits_stale for v in informative)
    stale_only = sum(v.fits_stale and not v.fits_current for v in informative)
    both = sum(v.fits_current and v.fits_stale and v.changed for v in informative)
    if not any(v.changed for v in inner_verdicts):
        uses = "none"
    elif current_only and not stale_only:
        uses = "current"
    elif stale_only and not current_only:
        uses = "stale"
    elif both and not current_only and not stale_only:
        uses = "ambiguous"
    else:
        uses = "unknown"

    law = "stale" if uses == "stale" else "current"
    m = fitted[law] if uses != "none" else 1.0
    trailing = "none"
    for v, u in zip(verdicts, updates):
        if v.final and v.changed:
            if v.fits_current and not v.moved_outside:
                trailing = "ema"
            elif v.fits_stale and not v.moved_outside:
                trailing = "stale"
            else:
                trailing = "unexplained"
        fits_law = v.fits_current if law == "current" else v.fits_stale
        if v.changed and m is not None:
            # The law over every parameter: an update that skipped some does not fit.
            target = u.current if law == "current" else u.stale
            fits_law = fits_ema(u.after, u.before, target, m, eps=eps)[0]
        if v.final and not v.changed:
            fits_law = True  # the LAB order ends without an EMA
        v.fits_law = fits_law
        if v.changed and uses in ("current", "stale"):  # the law is known: judge by its θq
            _, still = _segment_mask(u.after, u.before, segments, eps)
            v.skipped = _skipped(u, still, segments, eps, m, uses)
    order = None
    if uses in ("current", "ambiguous") and trailing in ("none", "ema", "unexplained"):
        order = "paper" if trailing == "ema" else "lab"
    return EmaAnalysis(uses=uses, m=m, order=order, trailing=trailing, updates=verdicts)
