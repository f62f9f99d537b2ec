"""The refactor guard: record a submission's trajectory on the grader's fixed probe, and find
the first step where two recordings part.

A trajectory is plain JSON: per training step the batch's source ids, the query encoder's raw
projection ``q``, the key encoder's ``k``, the gradient the loss sent into ``q``, the loss the
reference computes from those (with the FIFO dictionary of the keys seen so far), and both
encoders' parameters at the key forward; then the returned queue, ids, history and final
parameters. ``compare`` walks two of them in that order and stops at the first quantity that
differs beyond the tolerance (bitwise by default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from moco_ref.core.tolerance import NotComparable, mismatch
from moco_ref.observe.options import GradeOptions

FORMAT = "moco-ref-trajectory/1"
STEP_QUANTITIES = ("ids", "q", "k", "grad", "loss", "query_params", "key_params")
FINAL_QUANTITIES = ("queue", "queue_ids", "history", "drift", "query_params", "key_params")


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().to(torch.float64).tolist() if value.is_floating_point() \
            else value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def trajectory_from_observations(observations: dict, style: str, source: str = "") -> dict:
    """The trajectory of a ``lab`` observation record; other styles keep their whole record
    (compared in its own structure)."""
    from moco_ref import __version__

    head = {"format": FORMAT, "submission": source, "style": style,
            "provenance": {"moco_ref": __version__, "torch": torch.__version__}}
    if style != "lab":
        return {**head, "record": _plain(observations)}
    from moco_ref.judge.evidence import LabEvidence

    evidence = LabEvidence(observations, GradeOptions(style="lab"))
    losses = _reference_losses(evidence)
    steps = [
        {"step": s.index, "epoch": s.epoch, "ids": _plain(s.ids), "q": _plain(s.z),
         "k": _plain(s.k), "grad": _plain(s.grad), "loss": losses[t],
         "query_params": _plain(s.query_params), "key_params": _plain(s.key_params)}
        for t, s in enumerate(evidence.steps)
    ]
    returned = evidence.returned
    final = {name: _plain(returned.get(name)) for name in ("queue", "queue_ids", "history",
                                                           "drift", "query_params",
                                                           "key_params")}
    return {**head, "steps": steps, "final": final,
            "warmup": _plain(observations.get("moco_warmup", {}).get("result"))}


def _reference_losses(evidence) -> list[float | None]:
    """−ln p⁺ from the observed q, k and the FIFO of the keys seen before each step: the
    judge's reference form (in-batch negatives while the queue is empty)."""
    from moco_ref.judge.invariants.loss import REFERENCE_FORM, form_gradient

    try:
        inputs = evidence.loss_inputs
    except Exception:  # noqa: BLE001 - a run the reference cannot follow has no losses
        return [None] * len(evidence.steps)
    temperature = evidence.options.temperature
    out = []
    for step in inputs:
        result = form_gradient(REFERENCE_FORM, step, temperature)
        out.append(None if result is None else result[0])
    return out


@dataclass(frozen=True)
class Divergence:
    where: str  # e.g. "step 3 (epoch 1): k"
    detail: str

    def __str__(self) -> str:
        return f"first divergence at {self.where}: {self.detail}"


def _numeric_difference(a, b, rtol: float, atol: float) -> str | None:
    """How ``a`` differs from ``b`` beyond tolerance (relative to ``b``), or None."""
    if a is None or b is None:
        return None if a is b else f"one side has no value (A: {_brief(a)}, B: {_brief(b)})"
    try:
        found = mismatch(b, a, rtol, atol)
    except NotComparable as reason:
        if reason.shapes is not None:
            return f"shapes differ: A {reason.shapes[1]}, B {reason.shapes[0]}"
        return None if a == b else f"A {_brief(a)} != B {_brief(b)}"
    if found is None:
        return None
    position = f" at index {list(found.index)}" if found.index else ""
    return (f"{found.count} of {found.size} values differ; max abs error {found.max_abs:.3g}, "
            f"max rel error {found.max_rel:.3g}{position} "
            f"(A {found.got:.17g}, B {found.expected:.17g})")


def _brief(value) -> str:
    text = json.dumps(value)
    return text if len(text) < 80 else text[:77] + "..."


def compare(a: dict, b: dict, rtol: float = 0.0, atol: float = 0.0) -> Divergence | None:
    """The first place where trajectories ``a`` and ``b`` differ, or None."""
    for document, name in ((a, "A"), (b, "B")):
        if document.get("format") != FORMAT:
            raise ValueError(f"{name} is not a moco-ref trajectory (format {FORMAT!r})")
    if a["style"] != b["style"]:
        return Divergence("the style", f"A is {a['style']}, B is {b['style']}")
    if "record" in a:
        return _compare_tree(a["record"], b.get("record"), "record", rtol, atol)
    for t, (x, y) in enumerate(zip(a["steps"], b["steps"])):
        for quantity in STEP_QUANTITIES:
            difference = _numeric_difference(x[quantity], y[quantity], rtol, atol)
            if difference:
                return Divergence(f"step {t} (epoch {x['epoch']}, ids {_brief(x['ids'])}): "
                                  f"{quantity}", difference)
    if len(a["steps"]) != len(b["steps"]):
        return Divergence(f"step {min(len(a['steps']), len(b['steps']))}",
                          f"A has {len(a['steps'])} steps, B has {len(b['steps'])}")
    for quantity in FINAL_QUANTITIES:
        difference = _numeric_difference(a["final"][quantity], b["final"][quantity], rtol, atol)
        if difference:
            return Divergence(f"the end of training: {quantity}", difference)
    difference = _numeric_difference(_flat_warmup(a), _flat_warmup(b), rtol, atol)
    return Divergence("moco_warmup", difference) if difference else None


def _flat_warmup(document: dict):
    return json.dumps(document.get("warmup"), sort_keys=True)


def _compare_tree(a, b, path: str, rtol: float, atol: float) -> Divergence | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return Divergence(f"{path}.{key}", "present on one side only")
            found = _compare_tree(a[key], b[key], f"{path}.{key}", rtol, atol)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and a and isinstance(a[0], (dict, list)):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _compare_tree(x, y, f"{path}[{i}]", rtol, atol)
            if found:
                return found
        if len(a) != len(b):
            return Divergence(path, f"A has {len(a)} entries, B has {len(b)}")
        return None
    difference = _numeric_difference(a, b, rtol, atol)
    return Divergence(path, difference) if difference else None


def save(trajectory: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(trajectory, allow_nan=True))


def load(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read trajectory {path}: {error}") from None


