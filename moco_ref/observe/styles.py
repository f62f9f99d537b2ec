"""The submission styles as the observing side knows them: how each is recognised, the parts
it is observed in, and which observer records it. The judging side's half of each style (its
record validation, evidence and default entries) is ``moco_ref.judge.styles``; the checks that
apply to a style are those with an implementation for it (``moco_ref.judge.registry``)."""

from __future__ import annotations

from dataclasses import dataclass

from moco_ref.observe.loader import NotASubmission


@dataclass(frozen=True)
class Part:
    name: str  # also the record key it fills
    entry_points: tuple[str, ...]  # names in the submission's namespace it calls
    watches_input: bool = False  # note whether the entry point modified the probe's x in place


@dataclass(frozen=True)
class ObservedStyle:
    name: str
    entry_points: tuple[str, ...]  # the names a submission of this style defines
    parts: tuple[Part, ...]  # observed one part at a time; empty: observed whole
    observer: str  # the function of ``moco_ref.observe.observers`` that records it
    records_probe_dtype: bool = False  # the probe model is rebuilt in the submission's dtype
    shares_defined: bool = False  # the record says which entry points are defined


LAB = ObservedStyle(
    "lab", ("train_moco", "moco_warmup"),
    (Part("moco_warmup", ("moco_warmup",)),
     Part("train_moco", ("train_moco",), watches_input=True)),
    "observe_lab", records_probe_dtype=True)
COMPONENTS = ObservedStyle(
    "components", ("KeyQueue", "momentum_update", "contrastive_logits", "info_nce_loss"),
    (Part("moco_warmup", ("moco_warmup",)),
     Part("queue", ("KeyQueue",)),
     Part("ema", ("momentum_update",)),
     Part("logits", ("contrastive_logits",)),
     Part("loss", ("info_nce_loss",))),
    "observe_components", shares_defined=True)
BUILDER = ObservedStyle("builder", ("MoCo",), (), "observe_builder")

OBSERVED_STYLES: dict[str, ObservedStyle] = {s.name: s for s in (LAB, COMPONENTS, BUILDER)}


def detect_style(namespace: dict) -> str:
    """``lab`` if ``train_moco`` is defined; ``builder`` if a class ``MoCo``; ``components`` if
    ``KeyQueue``/``contrastive_logits``/``momentum_update``/``info_nce_loss``; ``lab`` if only
    ``moco_warmup``. Raises ``ValueError`` naming what was looked for when nothing fits."""
    if callable(namespace.get("train_moco")):
        return LAB.name
    if isinstance(namespace.get("MoCo"), type):
        return BUILDER.name
    if any(callable(namespace.get(name)) for name in COMPONENTS.entry_points):
        return COMPONENTS.name
    if callable(namespace.get("moco_warmup")):
        return LAB.name
    raise NotASubmission(
        "no MoCo entry point found: a lab submission defines train_moco and moco_warmup, a "
        "builder submission a class MoCo, a components submission KeyQueue, "
        "momentum_update, contrastive_logits and info_nce_loss (see COMPONENTS.md)"
    )
