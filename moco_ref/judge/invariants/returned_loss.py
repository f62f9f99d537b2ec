"""I8 on a loss a module returns itself (``forward`` returning a scalar, not logits): the
query encoder trains on that number, so it must be the cross-entropy of the logits the
module made — summed over a symmetric module's two halves — up to one positive scale for
the whole run (MoCo v3 multiplies by ``2T``; a mean of the halves is half the sum). A scale
only changes the effective learning rate; anything else (a difference of the halves, one
half alone, a half weighted apart) trains another objective.

Plain numbers in, a verdict out: the cross-entropies are recomputed by the caller from the
recorded logits and labels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_TOLERANCE = 1e-4  # relative: float32 losses against float64 recomputations


@dataclass(frozen=True)
class ReturnedLossFit:
    """How the returned losses relate to the recomputed cross-entropies, over every step."""

    scale: float | None  # the one positive c with loss = c·Σ CE at every step, or None
    first_off: int | None  # the first step that no such c explains
    weights: tuple[float, ...] = ()  # least-squares weights of each half's CE (two halves)
    loss_off: float = float("nan")  # the returned loss at ``first_off``
    parts_off: tuple[float, ...] = ()  # the cross-entropies at ``first_off``
    scale_before: float | None = None  # the c of the steps before ``first_off``, if any

    @property
    def consistent(self) -> bool:
        return self.scale is not None


def fit_returned_loss(losses: list[float], cross_entropies: list[list[float]]) -> ReturnedLossFit:
    """``losses[t]`` the module's returned loss at step t, ``cross_entropies[t]`` the
    cross-entropy of each of that step's (logits, labels) pairs, in the module's order."""
    totals = [sum(parts) for parts in cross_entropies]
    ratios = [loss / total if total > 0 else float("nan")
              for loss, total in zip(losses, totals, strict=True)]
    if not ratios:
        return ReturnedLossFit(None, None)
    scale = sorted(ratios)[len(ratios) // 2] if all(r == r for r in ratios) else float("nan")
    off = [t for t, ratio in enumerate(ratios)
           if not (scale > 0 and abs(ratio - scale) <= SCALE_TOLERANCE * scale)]
    if not off:
        return ReturnedLossFit(scale, None)
    first = off[0]
    return ReturnedLossFit(None, first, _half_weights(losses, cross_entropies),
                           loss_off=losses[first], parts_off=tuple(cross_entropies[first]),
                           scale_before=ratios[0] if first > 0 else None)


def _half_weights(losses: list[float], cross_entropies: list[list[float]]) -> tuple[float, ...]:
    """The weights ``w`` with ``loss ≈ Σ w_i · CE_i`` over the steps (least squares), when
    every step has the same number of halves and there are enough steps to tell them apart."""
    widths = {len(parts) for parts in cross_entropies}
    if len(widths) != 1 or (width := widths.pop()) < 2 or len(losses) <= width:
        return ()
    design = torch.tensor(cross_entropies, dtype=torch.float64)  # [steps, halves]
    target = torch.tensor(losses, dtype=torch.float64).unsqueeze(1)  # [steps, 1]
    solved = torch.linalg.lstsq(design, target).solution.squeeze(1)
    if not bool(torch.isfinite(solved).all()):
        return ()
    return tuple(round(float(w), 3) for w in solved)
