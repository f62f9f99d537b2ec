"""Observation in parts, so a job that is stopped still reports what finished.

A style's observation splits into independent *parts*, each the record entry of one entry
point of the submission:

- ``lab``: ``moco_warmup`` (``moco_warmup()``), ``train_moco`` (the probe's training run);
- ``components``: ``moco_warmup``, ``queue`` (``KeyQueue``), ``ema`` (``momentum_update``),
  ``logits`` (``contrastive_logits``), ``loss`` (``info_nce_loss``);
- any other style (``builder``): one part, ``all``.

The part names and how the grader assembles parts into one record are the contract
(``moco_ref.probe.parts``); this module observes one part inside the submission's process.

The worker observes the parts one after the other and sends each as soon as it is done; the
grader gives each its own time budget (``--check-timeout``). A part that runs out of time,
or whose process dies, is recorded as missing, and the remaining parts are observed in a new
process. Before judging, the grader puts a typed ``Unobserved`` entry in place of a missing
part, so every check needing it reports ``timeout`` (or ``error``) — never ``passed`` — while
the checks on the finished parts are judged as usual.

A part is observed by running the harness's own ``observe`` on a view of the submission's
namespace that hides the entry points of the other parts, so the harness stays the single
place that knows how to observe; only the record keys are named here.
"""

from __future__ import annotations

import hashlib
import types

import torch

from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import DEFINED_KEY, INPUT_MUTATED, PARTS, PROBE_DTYPE, WHOLE
from moco_ref.probe.styles import OBSERVED_STYLES


def observe_part(namespace: dict, style: str, name: str,
                 options: GradeOptions) -> tuple[object, dict]:
    """Observe one part: ``(entry of the record for this part, the rest of the record)``.

    Runs ``observe`` on the namespace with the other parts' entry points hidden, so only this
    part's entry point is called. For ``WHOLE`` the entry is the whole record.
    """
    from moco_ref.observe.observers import observe

    parts = PARTS.get(style)
    if not parts or name == WHOLE:
        return observe(namespace, style, options), {}
    part = next(p for p in parts if p.name == name)
    hidden = {entry for p in parts if p is not part for entry in p.entry_points}
    view = {key: value for key, value in namespace.items() if key not in hidden}
    watch = None
    entry_point = part.entry_points[0]
    if part.watches_input and isinstance(view.get(entry_point), types.FunctionType):
        view[entry_point], watch = _watching_input(view[entry_point])
    dtype = str(torch.get_default_dtype())  # the probe model is built with it
    record = observe(view, style, options)
    entry = record.pop(part.name, None)
    if OBSERVED_STYLES[style].records_probe_dtype:
        record[PROBE_DTYPE] = dtype
    if watch is not None and watch["mutated"] and isinstance(entry, dict):
        entry[INPUT_MUTATED] = True
    defined = record.get(DEFINED_KEY)
    if isinstance(defined, dict):  # components: keep only what this part could see
        record[DEFINED_KEY] = {key: value for key, value in defined.items()
                                if key in part.entry_points}
    return entry, record


def _digest(tensor) -> bytes | None:
    try:
        return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).digest()
    except Exception:  # noqa: BLE001 - not a tensor: nothing to compare
        return None


def _watching_input(function: types.FunctionType):
    """``function`` wrapped so the grader learns whether it modified its ``x`` in place. The
    wrapper is built on ``function``'s own globals, so the observer still sets ``views`` and
    ``SEED`` where the submission reads them."""
    state = {"mutated": False}
    digest = _digest

    def observed(initial, x, *args, **kwargs):
        before = digest(x)
        try:
            return function(initial, x, *args, **kwargs)
        finally:
            state["mutated"] = before is not None and digest(x) != before

    wrapped = types.FunctionType(observed.__code__, function.__globals__, function.__name__,
                                 observed.__defaults__, observed.__closure__)
    wrapped.__qualname__ = function.__qualname__
    wrapped.__doc__ = function.__doc__
    return wrapped, state


def entry_points_defined(namespace: dict, style: str | None) -> dict[str, bool]:
    """Which entry points of the style's parts the namespace defines (sent with the stage)."""
    return {entry: callable(namespace.get(entry))
            for part in PARTS.get(style or "", ()) for entry in part.entry_points}
