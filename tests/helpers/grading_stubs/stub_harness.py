"""A tiny stand-in for the observers, style detection, judge and registry of moco_ref.

Checks (all on ``moco_warmup()``): ``W1-warmup-fifo`` and ``W2-warmup-ema`` for every style,
and ``B1-builder-only``, which does not apply to ``lab``. ``install()`` puts the stand-ins in
``sys.modules``; the ``sitecustomize`` beside this file does that in every child process
started with this folder on ``PYTHONPATH`` (worker processes, pytest subprocesses).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

# At import (before the worker's reference-import guard is installed): this module is not
# part of moco_ref, so the guard would refuse it later, as it refuses a submission.
from moco_ref.probe import styles as real_styles
from moco_ref.probe.cases import default_lab_probe


@dataclass(frozen=True)
class CheckSpec:
    check_id: str
    title: str
    family: str
    points: float
    styles: tuple[str, ...]
    doc: str = ""


SPECS = (
    CheckSpec("W1-warmup-fifo", "warmup FIFO keeps the newest", "warmup", 1.0, ("lab",)),
    CheckSpec("W2-warmup-ema", "warmup EMA value", "warmup", 2.0, ("lab",)),
    CheckSpec("B1-builder-only", "a builder-only check", "I1", 1.0, ("builder",)),
)


def all_checks(style=None):
    return [spec for spec in SPECS if style is None or style in spec.styles]


def unknown_selectors(selectors) -> list[str]:
    known = {spec.check_id for spec in SPECS} | {spec.check_id.split("-")[0] for spec in SPECS}
    return [s for s in selectors if s not in known]


def detect_style(namespace: dict) -> str:
    if "moco_warmup" in namespace or "train_moco" in namespace:
        return "lab"
    raise ValueError("no MoCo names found: expected moco_warmup/train_moco (lab)")


def observe(namespace: dict, style: str, options) -> dict:
    """A record in the real ``lab`` shape: the probe, ``moco_warmup``'s result, and a
    ``train_moco`` entry that says it was not run (the stand-in judges the warm-up only)."""
    record = {"probe": default_lab_probe(options.seed, options.probe_key).to_dict(),
              "train_moco": {"defined": False, "error": "not observed by the stand-in"}}
    function = namespace.get("moco_warmup")
    if function is None:
        record["moco_warmup"] = {"defined": False, "error": "moco_warmup is not defined",
                                 "result": None}
        return record
    try:
        record["moco_warmup"] = {"defined": True, "error": None, "result": function()}
    except Exception as exc:  # noqa: BLE001 - recorded, judged as an error
        record["moco_warmup"] = {"defined": True, "error": f"{type(exc).__name__}: {exc}",
                                 "result": None}
    return record


def judge(observations: dict, style: str, options, *, deadline=None):
    from moco_ref.judge.gaps import Unobserved
    from moco_ref.judge.results import CheckResult, Status

    warmup = observations.get("moco_warmup") or {}
    results = []
    for spec in SPECS:
        if not options.selects(spec.check_id):
            continue
        if style not in spec.styles:
            status, message = Status.NOT_APPLICABLE, f"does not apply to style {style}"
        elif isinstance(warmup, Unobserved):
            status = Status.TIMEOUT if warmup.timed_out else Status.ERROR
            message = f"not judged: {warmup.part} was not observed: {warmup.reason}"
        elif warmup.get("error"):
            status, message = Status.ERROR, f"moco_warmup raised {warmup['error']}"
        elif spec.check_id.startswith("W1"):
            fifo = warmup["result"]["FIFO"]
            ok = fifo == ["c", "d", "e", "f"]
            status = Status.PASSED if ok else Status.FAILED
            message = "" if ok else f"queue kept the oldest: expected ['c','d','e','f'], got {fifo}"
        else:
            ema = warmup["result"]["EMA"]
            ok = all(abs(a - b) < 1e-9 for a, b in zip(ema, [0.2, 2.2], strict=True))
            status = Status.PASSED if ok else Status.FAILED
            message = "" if ok else f"EMA expected [0.2, 2.2], got {ema}"
        results.append(
            CheckResult(spec.check_id, spec.title, spec.family, spec.points, status, message)
        )
    return results, {"m": 0.9, "capacity": 4, "order": "lab"}


def install(modules=None) -> dict:
    """The stand-in modules, put in ``modules`` (default ``sys.modules``)."""
    target = sys.modules if modules is None else modules
    this = sys.modules[__name__]
    stand_ins = {}
    for name, attributes in (
        ("moco_ref.observe.observers", {"observe": observe}),
        ("moco_ref.probe.styles", {**vars(real_styles), "detect_style": detect_style}),
        ("moco_ref.judge.judge", {"judge": judge}),
        ("moco_ref.judge.registry", {"all_checks": all_checks, "CheckSpec": CheckSpec,
                                     "unknown_selectors": unknown_selectors}),
    ):
        module = types.ModuleType(name)
        module.__dict__.update(attributes, __stub__=this)
        stand_ins[module.__name__] = module
    target.update(stand_ins)
    return stand_ins
