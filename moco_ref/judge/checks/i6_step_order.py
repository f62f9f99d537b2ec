"""I6: the key encoder starts as a copy, and the step follows the paper's or LAB 07's order."""

from __future__ import annotations

import torch

from moco_ref.judge.assertions import (
    NotJudged,
    assert_close,
    at_step,
    fail,
)
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.lab_evidence import LabEvidence
from moco_ref.judge.registry import check

KEY_STARTS_AS_COPY = check(
    "I6-key-starts-as-copy",
    "the key encoder starts as a copy of the query encoder",
    points=1,
    contract=(
        "The key encoder starts as an exact copy of the query encoder (θk = θq before the first "
        "step)."
    ),
)


@KEY_STARTS_AS_COPY.judges('lab')
def i6_key_starts_as_copy_lab(ev: LabEvidence) -> str | None:
    """At the first key forward θk equals θq (a deep copy of ``initial``, up to LAB order's
    first EMA, a no-op up to rounding): both step orders agree only from θk = θq."""
    first = ev.steps[0]
    initial = ev.require_run()["initial_params"].to(torch.float64)
    assert_close(first.key_params, initial,
                 "the key encoder did not start as a copy of the query encoder",
                 rtol=1e-5, atol=1e-6,
                 where=f"{at_step(0, first.ids)}, θk vs initial's parameters:")
    return None


@KEY_STARTS_AS_COPY.judges('builder')
def i6_key_starts_as_copy_builder(ev: BuilderEvidence) -> str | None:
    """At the first key forward θk equals θq as built: ``encoder_k`` starts as a copy of
    ``encoder_q`` (the official order's first EMA is then a no-op up to rounding)."""
    assert_close(ev.steps[0].key_params, ev.initial_query_params,
                 "the key encoder did not start as a copy of the query encoder",
                 rtol=1e-5, atol=1e-6, where="at step 0, θk at the key forward vs θq as built:")
    return None


EMA_USES_CURRENT_QUERY = check(
    "I6-ema-uses-current-query",
    "the step order is the paper's or LAB 07's",
    points=2,
    contract=(
        "The step follows one of MoCo's two orders: the paper's (key forward, loss, query "
        "update, EMA, enqueue) or LAB 07's / the official code's (EMA, key forward, loss, query "
        "update, enqueue)."
    ),
)


@EMA_USES_CURRENT_QUERY.judges('lab', 'builder')
def i6_ema_uses_current_query(ev: LabEvidence) -> str | None:
    """The key encoder that encodes step t's keys is m·θk + (1 − m)·θq with θq *after* step
    t − 1's optimizer step — true of both valid orders (paper: EMA after the query update;
    LAB 07 and the official module: EMA before the key forward). An EMA that uses θq from
    before the optimizer step (e.g. placed between the key forward and the update, or after
    the key forward inside ``forward``) is neither order."""
    ema = ev.ema
    if ema.uses == "none" and isinstance(ev, LabEvidence) and ev.query_never_trained:
        raise NotJudged("contract-fresh-gradients", "the query encoder never changed, so no "
                        "EMA update was seen whose place in the step could be judged")
    if ema.uses == "none":
        # no EMA at all is I7's charge: there is no update whose place in the step was seen
        raise NotJudged("I7-ema-law", "the key encoder never moved, so no EMA update was seen "
                                      "whose place in the step could be judged")
    if ema.uses == "stale" or ema.trailing == "stale":
        stale = [u for u in ema.updates if u.fits_stale and not u.fits_current] or ema.updates
        update = next((u for u in stale if u.residual_current > 0.05 and u.residual_stale < 0.05),
                      stale[0])
        fail("the EMA used the query parameters from before the optimizer step — an order that is "
             "neither the paper's (EMA after the update) nor LAB 07's (EMA before the key forward)",
             where=f"at step {update.step}" if not update.final else "after the last step",
             expected="θk = m·θk + (1 − m)·θq with θq after the previous update (residual "
                      f"{update.residual_current:.2g})",
             got=f"θk = m·θk + (1 − m)·θq with θq one update older (residual "
                 f"{update.residual_stale:.2g})")
    if ema.uses == "unknown":
        update = next((u for u in ema.updates if u.changed and not u.final), ema.updates[0])
        fail("no key update could be placed in either valid order", where=f"at step {update.step}",
             expected="θk = m·θk + (1 − m)·θq with θq current (paper or LAB order)",
             got=f"residuals {update.residual_current:.2g} (current θq) and "
                 f"{update.residual_stale:.2g} (θq one update older)")
    order = ema.order or "lab"
    note = {"lab": "observed order: LAB 07 / official (EMA before the key forward)",
            "paper": "observed order: paper (EMA after the query update)"}[order]
    return note + (" — updates too small to tell θq apart" if ema.uses == "ambiguous" else "")
