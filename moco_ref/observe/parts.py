"""Observation in parts, so a job that is stopped still reports what finished.

A style's observation splits into independent *parts*, each the record entry of one entry
point of the submission:

- ``lab``: ``moco_warmup`` (``moco_warmup()``), ``train_moco`` (the probe's training run);
- ``components``: ``moco_warmup``, ``queue`` (``KeyQueue``), ``ema`` (``momentum_update``),
  ``logits`` (``contrastive_logits``), ``loss`` (``info_nce_loss``);
- any other style (``builder``): one part, ``all``.

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
from dataclasses import dataclass

import torch

from moco_ref.observe.options import GradeOptions

WHOLE = "all"
INPUT_MUTATED = "input_mutated"  # train_moco changed the probe's images x in place
PROBE_DTYPE = "probe_dtype"  # torch's default dtype when the probe was built (lab)


@dataclass(frozen=True)
class Part:
    name: str  # also the record key it fills
    entry_points: tuple[str, ...]  # names in the submission's namespace it calls


PARTS: dict[str, tuple[Part, ...]] = {
    "lab": (
        Part("moco_warmup", ("moco_warmup",)),
        Part("train_moco", ("train_moco",)),
    ),
    "components": (
        Part("moco_warmup", ("moco_warmup",)),
        Part("queue", ("KeyQueue",)),
        Part("ema", ("momentum_update",)),
        Part("logits", ("contrastive_logits",)),
        Part("loss", ("info_nce_loss",)),
    ),
}

# components record: which "defined" entry each part owns
_DEFINED_KEY = "defined"


def part_names(style: str | None) -> list[str]:
    return [part.name for part in PARTS.get(style or "", ())] or [WHOLE]


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
    if style == "lab" and name == "train_moco" and isinstance(view.get("train_moco"),
                                                                types.FunctionType):
        view["train_moco"], watch = _watching_input(view["train_moco"])
    dtype = str(torch.get_default_dtype())  # the probe model is built with it
    record = observe(view, style, options)
    entry = record.pop(part.name, None)
    if style == "lab":
        record[PROBE_DTYPE] = dtype
    if watch is not None and watch["mutated"] and isinstance(entry, dict):
        entry[INPUT_MUTATED] = True
    defined = record.get(_DEFINED_KEY)
    if isinstance(defined, dict):  # components: keep only what this part could see
        record[_DEFINED_KEY] = {key: value for key, value in defined.items()
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


def assemble(style: str, meta: list[dict], entries: dict[str, object]) -> dict:
    """One record from the parts' entries and the rest of the record each part run gave."""
    if WHOLE in entries:
        whole = entries[WHOLE]
        return dict(whole) if isinstance(whole, dict) else {WHOLE: whole}
    record: dict = {}
    defined: dict = {}
    for rest in meta:
        for key, value in rest.items():
            if key == _DEFINED_KEY and isinstance(value, dict):
                defined.update(value)
            else:
                record.setdefault(key, value)
    if defined or style == "components":
        record[_DEFINED_KEY] = defined
    record.update(entries)
    return record


def fill_components_meta(record: dict, defined: dict, options: GradeOptions) -> None:
    """A components record whose part runs died still needs the shared entries (seed,
    fingerprints, which entry points are defined) for its other entries to be read: the grader
    draws the cases itself and takes ``defined`` from the worker's stage report."""
    from moco_ref.observe.strategies import cases_fingerprint, component_cases

    record.setdefault("seed", int(options.seed))
    fingerprints = record.setdefault("fingerprints", {})
    for part in PARTS["components"]:
        if part.name != "moco_warmup":
            fingerprints.setdefault(part.name,
                                    cases_fingerprint(component_cases(part.name, options.seed)))
    merged = record.setdefault(_DEFINED_KEY, {})
    for part in PARTS["components"]:
        for entry in part.entry_points:
            if entry != "moco_warmup":
                merged.setdefault(entry, bool(defined.get(entry, False)))


def entry_points_defined(namespace: dict, style: str | None) -> dict[str, bool]:
    """Which entry points of the style's parts the namespace defines (sent with the stage)."""
    return {entry: callable(namespace.get(entry))
            for part in PARTS.get(style or "", ()) for entry in part.entry_points}
