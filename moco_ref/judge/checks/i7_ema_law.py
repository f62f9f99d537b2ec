"""I7: θk ← m·θk + (1 − m)·θq over parameters, one slow m."""

from __future__ import annotations

import functools
import math

import torch

from moco_ref.core.momentum import momentum_update
from moco_ref.judge.assertions import (
    CheckFailure,
    NotJudged,
    fail,
    fmt_values,
    require,
)
from moco_ref.judge.builder_defaults import ema_at_defaults
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.checks.common import MAX_SERIES
from moco_ref.judge.components_evidence import ComponentsEvidence
from moco_ref.judge.lab_evidence import LabEvidence
from moco_ref.judge.registry import check


def _close_momentum(fitted: float, expected: float) -> bool:
    return abs((1 - fitted) - (1 - expected)) <= max(0.02 * (1 - expected), 1e-6)


def _reference_ema(case, m: float | None = None):
    key, query = case.models()
    momentum_update(key, query, case.m if m is None else m)
    return key


def ema_trace(ev: LabEvidence) -> dict:
    """For the feedback's figure: θk at one parameter (the one furthest off the law, else the
    one θq pulls hardest at the first update) at each key forward, against m·θk + (1 − m)·θq
    from the key forward before, with the run's fitted m; {} when the evidence has no such
    snapshots or no m was fitted."""
    ema = ev.ema
    steps = ev.steps[:MAX_SERIES] if isinstance(ev, LabEvidence) else []
    if ema.m is None or len(steps) < 2:
        return {}
    m = float(ema.m)
    stale = ema.uses == "stale"
    key_at = [step.key_params.to(torch.float64) for step in steps]
    query_at = [step.query_params.to(torch.float64) for step in steps]
    off = sum((key_at[t] - m * key_at[t - 1] - (1 - m) * query_at[t - 1 if stale else t]).abs()
              for t in range(1, len(steps)))
    pull = (query_at[1] - key_at[0]).abs()
    # where the law is broken most, else where θq pulls hardest
    j = int(off.argmax()) if float(off.max()) > 1e-6 * float(pull.max()) else int(pull.argmax())
    key = [float(step.key_params[j]) for step in steps]
    predicted = [None] + [
        m * key[t - 1] + (1 - m) * float(steps[t - 1 if stale else t].query_params[j])
        for t in range(1, len(steps))]
    query = [float(step.query_params[j]) for step in steps]
    return {"ema_m": float(f"{m:.6g}"), "ema_parameter": j,
            "ema_key": [float(f"{v:.6g}") for v in key],
            "ema_predicted": [None if v is None else float(f"{v:.6g}") for v in predicted],
            "ema_query": [float(f"{v:.6g}") for v in query]}


def _with_ema_trace(judge):
    """Failures of ``judge`` carry ``ema_trace`` in their details."""
    @functools.wraps(judge)
    def judged(ev):
        try:
            return judge(ev)
        except CheckFailure as failure:
            try:
                failure.details.update(ema_trace(ev))
            except Exception:  # the picture is a bonus: never let it change the verdict
                pass
            raise
    return judged


def _skipped_misconception(names: list[str]) -> str:
    """What the EMA's skipped parameters say about how it was written."""
    if all(name.rsplit(".", 1)[-1] == "bias" for name in names):
        return ("the EMA skipped the biases: it runs over the weights only (a state_dict "
                "filtered by \"weight\", or p.dim() > 1), so every bias keeps its initial value")
    heads = {name.split(".", 1)[0] for name in names}
    return (f"the EMA skipped part of the model ({', '.join(sorted(heads))}): it runs over "
            "some modules only (e.g. the encoder's parameters, not the projection head's)")


def _require_query_moved(ev) -> None:
    """A key encoder that never moved says nothing of its EMA when θq never moved either (and
    θk started as its copy): ``NotJudged``, the query's training carrying the explanation."""
    if isinstance(ev, LabEvidence) and ev.query_never_trained:
        raise NotJudged("contract-fresh-gradients", "the query encoder never changed, so an "
                        "EMA toward it leaves the key encoder where it was")


EMA_LAW = check(
    "I7-ema-law",
    "θk ← m·θk + (1 − m)·θq over all parameters, one m",
    points=2,
    contract=(
        "θk ← m·θk + (1 − m)·θq over every parameter (not buffers), with one m for the whole "
        "run."
    ),
)


@EMA_LAW.judges('lab', 'builder')
@_with_ema_trace
def i7_ema_law(ev: LabEvidence) -> str | None:
    """Between two key forwards θk changes only by θk ← m·θk + (1 − m)·θq, over every
    parameter, with one m for the whole run (fitted from the snapshots): not by the
    optimizer, not on part of the model. A builder module built at its own defaults still
    moves θk by an EMA toward θq."""
    if isinstance(ev, LabEvidence):
        ev.require_key_encoder_used()
    ema = ev.ema
    if ema.uses == "none":
        _require_query_moved(ev)
    if ema.uses == "none":  # m = 1 fits trivially, but it is no moving average at all
        fail("the key encoder never moved: no EMA update was applied", where="over the whole run",
             expected="θk ← m·θk + (1 − m)·θq between key forwards, moving θk toward θq",
             got="θk unchanged (within float noise) from its initial copy")
    m = ema.m
    tags = [getattr(step, "key_tag", None) for step in ev.steps]
    for update in ema.updates:
        where = "after the last step" if update.final else f"between steps {update.step - 1} " \
                                                            f"and {update.step}"
        t = update.step
        replaced = not update.final and 0 < t < len(tags) and tags[t] != tags[t - 1]
        if replaced and (update.moved_outside or not update.fits_law):
            # a new model copy is fine if it carries the EMA; this one does not
            fail("the key encoder was replaced by a new model copy that is not the EMA of the "
                 "old one", where=where,
                 expected=f"θk ← m·θk + (1 − m)·θq (m = {m:.4g}) on the same key encoder",
                 got=f"keys encoded by another model copy from step {t} on (e.g. key = "
                     "copy.deepcopy(query)), which drops the momentum history")
        if update.skipped:
            fail(_skipped_misconception(update.skipped), where=where,
                 expected=f"every parameter to follow θk ← m·θk + (1 − m)·θq (m = {m:.4g})",
                 got=f"{', '.join(update.skipped)} unchanged while θq moved")
        if update.moved_outside:
            fail("the key encoder moved outside the EMA (is it updated by the optimizer?)",
                 where=where, expected="θk unchanged except by the EMA",
                 got="θk changed between the key forward and the EMA")
        if not update.fits_law:
            fail("the key update is not an EMA with the run's momentum", where=where,
                 expected=f"θk ← m·θk + (1 − m)·θq with m = {m:.4g}",
                 got=f"a change off by {min(update.residual_current, update.residual_stale):.2g} "
                     "of its size" if update.changed else "no change at all (no EMA this step)")
    return f"m = {m:.6g}" + (ema_at_defaults(ev) if isinstance(ev, BuilderEvidence) else "")


@EMA_LAW.judges('components')
def i7_ema_law_components(ev: ComponentsEvidence) -> str | None:
    """``momentum_update(key, query, m)`` sets every key parameter to m·θk + (1 − m)·θq
    (within float64 rounding) and leaves the query model unchanged."""
    for number, case, output in ev.outputs("ema"):
        require(output["query_unchanged"], "momentum_update changed the query model",
                where=f"in case {number} (m = {case.m:g})", expected="θq unchanged",
                got="θq modified")
        expected = [p.detach() for p in _reference_ema(case).parameters()]
        got = output["key_params"]
        close = len(got) == len(expected) and all(
            g.shape == w.shape and torch.allclose(g, w, rtol=1e-9, atol=1e-12)
            for g, w in zip(got, expected))
        if close:
            continue
        swapped = [p.detach() for p in _reference_ema(case, 1.0 - case.m).parameters()]
        is_swapped = len(got) == len(swapped) and all(
            g.shape == w.shape and torch.allclose(g, w, rtol=1e-9, atol=1e-12)
            for g, w in zip(got, swapped))
        fail("the EMA coefficients are swapped: θk ← (1 − m)·θk + m·θq" if is_swapped
             else "momentum_update does not follow θk ← m·θk + (1 − m)·θq",
             where=f"in case {number} (m = {case.m:g})",
             expected=fmt_values(torch.cat([w.flatten() for w in expected])),
             got=fmt_values(torch.cat([g.flatten() for g in got])) if got else "no parameters")
    return None


MOMENTUM_IN_RANGE = check(
    "I7-momentum-in-range",
    "the momentum m is a slow EMA, 0.5 ≤ m < 1",
    points=1,
    contract=(
        "The momentum m inferred from the run is a slow EMA, 0.5 ≤ m < 1 (and the assignment's "
        "m, if pinned)."
    ),
)


@MOMENTUM_IN_RANGE.judges('lab')
@_with_ema_trace
def i7_momentum_in_range_lab(ev: LabEvidence) -> str | None:
    """The inferred m lies in [0.5, 1): the key encoder keeps most of its own value each step
    (m = 0 copies θq, m < 0.5 is an EMA with its coefficients swapped, m = 1 never moves).
    When the assignment pins m (``--expect-m``), m must match it."""
    ev.require_key_encoder_used()
    ema = ev.ema
    m = ema.m
    if ema.uses == "none" or m is None:
        _require_query_moved(ev)
        fail("the key encoder never moved", where="over the whole run",
             expected="θk ← m·θk + (1 − m)·θq with 0.5 ≤ m < 1", got="m = 1 (frozen key encoder)")
    pinned = ev.options.expect_m
    if pinned is not None:
        require(abs((1 - m) - (1 - pinned)) <= max(0.02 * (1 - pinned), 1e-6),
                "the momentum is not the assignment's", where="fitted over the run",
                expected=f"m = {pinned}", got=f"m = {m:.6g}")
        return f"m = {m:.6g}"
    require(m > 1e-6, "the key encoder copies the query encoder (m = 0): no momentum",
            where="fitted over the run", expected="0.5 ≤ m < 1 (LAB 07: 0.95)", got=f"m = {m:.3g}")
    require(m >= 0.5, "the EMA coefficients look swapped: θk ← (1 − m)·θk + m·θq",
            where="fitted over the run", expected="0.5 ≤ m < 1 (LAB 07: 0.95)",
            got=f"m = {m:.4g} (i.e. {1 - m:.4g} with the coefficients swapped)")
    require(m < 1 - 1e-9, "the key encoder never moved", where="fitted over the run",
            expected="0.5 ≤ m < 1", got=f"m = {m:.6g}")
    return f"m = {m:.6g}"


@MOMENTUM_IN_RANGE.judges('builder')
def i7_momentum_in_range_builder(ev: BuilderEvidence) -> str | None:
    """The m fitted from the key updates is the m the module was built with (``--expect-m``
    when pinned): the key encoder keeps m of itself each step (not 1 − m, not a hard-coded
    value, and it does move)."""
    ema, m = ev.ema, ev.momentum
    where = "fitted over every step"
    if ema.uses == "none" or ema.m is None:
        fail("the key encoder never moved (no EMA)", where=where,
             expected=f"θk ← m·θk + (1 − m)·θq with m = {m:g}", got="θk frozen (m = 1)")
    fitted = ema.m
    if _close_momentum(fitted, m):
        return f"m = {fitted:.6g}"
    attribute = ev.module.get("attributes", {}).get("m")
    if _close_momentum(fitted, 1 - m):
        misconception = "the EMA coefficients are swapped: θk ← (1 − m)·θk + m·θq"
    elif fitted <= 1e-6:
        misconception = "the key encoder copies the query encoder (m = 0): no momentum"
    elif attribute is not None and not math.isclose(attribute, m) and _close_momentum(
            fitted, attribute):
        misconception = f"the module ignores the m it was built with (self.m = {attribute:g})"
    else:
        misconception = "the EMA does not use the module's momentum"
    fail(misconception, where=where, expected=f"m = {m:g}", got=f"m = {fitted:.4g}")


EMA_SKIPS_BUFFERS = check(
    "I7-ema-skips-buffers",
    "the EMA moves parameters, not buffers",
    points=1,
    contract=(
        "The EMA moves parameters only; buffers (e.g. BatchNorm running statistics) are left "
        "alone."
    ),
)


@EMA_SKIPS_BUFFERS.judges('components')
def i7_ema_skips_buffers_components(ev: ComponentsEvidence) -> str | None:
    """``momentum_update`` leaves the key model's buffers (BatchNorm running statistics)
    untouched: the EMA is over parameters only."""
    for number, case, output in ev.outputs("ema"):
        key, _ = case.models()
        expected = [b.detach() for b in key.buffers()]
        got = output["key_buffers"]
        same = len(got) == len(expected) and all(torch.equal(g, w) for g, w in zip(got, expected))
        require(same, "momentum_update also averaged the buffers",
                where=f"in case {number} (m = {case.m:g})",
                expected="the key model's buffers unchanged",
                got="running statistics moved toward the query model's")
    return None
