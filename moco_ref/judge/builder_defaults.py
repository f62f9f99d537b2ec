"""The ``builder`` module's run at its constructor's own defaults (``observe.builder_defaults``),
judged for what a module could do only at the probe's small sizes: the EMA (judged within
``I7-ema-law``) and the enqueue (within ``I3-fifo-keeps-newest``). A module that refuses to
be built or trained at its defaults is only noted: a course may always pass its sizes.
"""

from __future__ import annotations

import torch

from moco_ref.judge.assertions import fail
from moco_ref.judge.builder_evidence import error_line

EMA_RELATIVE = 0.05  # of the change: float32 parameters round each update
FLOAT32_EPS = float(torch.finfo(torch.float32).eps)


def _run(ev) -> dict | None:
    run = ev.record.get("defaults")
    return run if isinstance(run, dict) else None


def _built_as(run: dict) -> str:
    values = run.get("defaults") or {}
    shown = ", ".join(f"{name} = {values[name]:g}" for name in ("K", "dim", "m", "T")
                      if name in values)
    return f"MoCo(base_encoder) at its own defaults ({shown or 'none declared'})"


def _refused(run: dict) -> str:
    return (f"; {_built_as(run)} was not trained ({error_line(run['error'], 160)}), so it is "
            "not judged there")


def ema_at_defaults(ev) -> str:
    """Within ``I7-ema-law``: at the constructor's defaults θk still moves by an EMA toward θq
    over each step, θk ← θk + (1 − m)·(θq − θk) with θq before or after the optimizer's step
    (which of the two is ``I6``'s to judge, the value of m ``I7-momentum-in-range``'s, both at
    the probe's sizes). Returns a note for the passed message; fails otherwise."""
    run = _run(ev)
    if run is None:
        return ""
    if run.get("error"):
        return _refused(run)
    steps, judged, rates = run.get("steps") or [], 0, []
    for t in range(len(steps) - 1):
        q0, k0, q1, k1 = (steps[t].get("params_q"), steps[t].get("params_k"),
                          steps[t + 1].get("params_q"), steps[t + 1].get("params_k"))
        if any(v is None for v in (q0, k0, q1, k1)) or \
                len({v.shape for v in (q0, k0, q1, k1)}) != 1:
            continue
        moved = (k1 - k0).double()  # [P] what step t did to θk
        noise = 2 * FLOAT32_EPS * float(k0.double().norm()) + 1e-12
        gaps = [(q0 - k0).double(), (q1 - k0).double()]  # θq before, after the step's update
        if min(float(gap.norm()) for gap in gaps) <= 1e3 * noise:
            continue  # θk = θq (step 0): an EMA before the update cannot show yet
        where = f"{_built_as(run)}, step {t}"
        if float(moved.norm()) <= noise:
            fail("the key encoder never moved at the constructor's defaults: its EMA runs only "
                 "at other sizes", where=where,
                 expected="θk ← m·θk + (1 − m)·θq in each step, as at the probe's sizes",
                 got="θk unchanged while θq had moved")
        fits = []
        for gap in gaps:
            rate = float(moved @ gap / (gap @ gap))
            fits.append((float((moved - rate * gap).norm()), rate))
        residual, rate = min(fits)
        if residual > EMA_RELATIVE * float(moved.norm()) + noise or not 0 < rate <= 1:
            fail("the key encoder's update at the constructor's defaults is not an EMA toward "
                 "the query encoder", where=where,
                 expected="θk ← m·θk + (1 − m)·θq in each step, as at the probe's sizes",
                 got=f"a change {residual / float(moved.norm()):.2g} of its size away from "
                     "any such step")
        judged += 1
        rates.append(rate)
    if not judged:
        return ""
    return (f"; built as {_built_as(run)}, it held over {judged} step(s) "
            f"(m = {1 - sum(rates) / len(rates):.6g})")


def enqueue_at_defaults(ev) -> str:
    """Within ``I3-fifo-keeps-newest``: at the constructor's defaults each step still enqueues,
    i.e. changes the queue. Where and how it writes (a ring at ``queue_ptr``, a shift register)
    and what the keys hold are judged at the probe's sizes, by the storage-agnostic FIFO rule
    and by ``I2`` and ``I8``. Returns a note for the passed message; fails otherwise."""
    run = _run(ev)
    if run is None:
        return ""
    if run.get("error"):
        return _refused(run)
    judged = 0
    for t, step in enumerate(run.get("steps") or []):
        keys, ptr = step.get("keys"), step.get("ptr_before")
        if keys is None:
            continue
        n, K = len(keys), run.get("K") or 0
        if step["changed_count"] == 0:
            at = f"columns {ptr}–{(ptr + n - 1) % K}" if ptr is not None and K else "columns"
            fail("the step's keys were not enqueued at the constructor's defaults: its enqueue "
                 "runs only at other sizes", where=f"{_built_as(run)}, step {t}",
                 expected=f"{at} set to the step's {n} keys",
                 got="no column of the queue changed")
        judged += 1
    return f"; built as {_built_as(run)}, {judged} enqueue(s) changed the queue" if judged \
        else ""
