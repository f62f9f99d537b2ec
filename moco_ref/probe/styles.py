"""The one table of submission styles: each style's name, the entry points a submission of it
defines, the parts it is observed in and which observer records it, and how a style is
recognised — from a namespace (inside the sandbox) or from source (on the grader's side,
without running anything). The judging side's half of each style (record validation, evidence,
default entries) is ``moco_ref.judge.styles``; the checks that apply to a style are those with
an implementation for it (``moco_ref.judge.registry``)."""

from __future__ import annotations

from dataclasses import dataclass


class NotASubmission(ValueError):
    """A file the grader cannot read as a submission (empty, undecodable, a corrupt notebook,
    no entry point): "not gradable" with this one sentence, no traceback."""


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
BUILDER_CLASS = BUILDER.entry_points[0]


def builder_class_name(names) -> str | None:
    """The name a builder submission's class goes by among ``names``: ``MoCo``, else one that
    is ``MoCo`` in another case (``Moco``, ``MOCO``, ``moco``; the first in sorted order),
    else None."""
    names = set(names)
    if BUILDER_CLASS in names:
        return BUILDER_CLASS
    others = sorted(name for name in names if name.casefold() == BUILDER_CLASS.casefold())
    return others[0] if others else None


# the official MoCo module's private methods: a class that has two of them is a MoCo module
# whatever its name (``probe.source.moco_like_class`` reads the same from the source)
MOCO_METHODS = frozenset({"_momentum_update_key_encoder", "_dequeue_and_enqueue",
                          "_batch_shuffle_ddp", "_batch_unshuffle_ddp"})


def moco_like_class_name(namespace: dict) -> str | None:
    """The one class of a loaded ``namespace`` that has at least two of ``MOCO_METHODS`` and
    a ``forward`` (a MoCo module under another name), or None."""
    found = [name for name, value in namespace.items() if isinstance(value, type)
             and callable(getattr(value, "forward", None))
             and sum(callable(getattr(value, method, None)) for method in MOCO_METHODS) >= 2
             and getattr(value, "__module__", None) == namespace.get("__name__")]
    return found[0] if len(found) == 1 else None


def as_entry_points(names) -> set[str]:
    """``names``' entry points, a builder class of another case counted as ``MoCo``."""
    names = set(names)
    found = names & set(ENTRY_POINTS)
    if builder_class_name(names):
        found.add(BUILDER_CLASS)
    return found


def style_of_names(names) -> str | None:
    """The style a set of entry-point names points to: ``lab`` if ``train_moco`` is among
    them; ``builder`` if ``MoCo``; ``components`` if any of ``KeyQueue``,
    ``momentum_update``, ``contrastive_logits``, ``info_nce_loss``; ``lab`` if only
    ``moco_warmup``; None if none of them."""
    names = set(names)
    if "train_moco" in names:
        return LAB.name
    if BUILDER.entry_points[0] in names:
        return BUILDER.name
    if names & set(COMPONENTS.entry_points):
        return COMPONENTS.name
    if "moco_warmup" in names:
        return LAB.name
    return None


NO_ENTRY_POINT = (
    "no MoCo entry point found: a lab submission defines train_moco and moco_warmup, a "
    "builder submission a class MoCo, a components submission KeyQueue, "
    "momentum_update, contrastive_logits and info_nce_loss (see COMPONENTS.md)")


def detect_style(namespace: dict) -> str:
    """The style of a loaded namespace (``style_of_names`` over the entry points it defines:
    callables, and a class for ``MoCo``). Raises ``NotASubmission`` naming what was looked
    for when nothing fits."""
    defined = {name for name in ENTRY_POINTS if callable(namespace.get(name))}
    defined.discard(BUILDER_CLASS)
    classes = {name for name, value in namespace.items() if isinstance(value, type)}
    if builder_class_name(classes) or (not defined and moco_like_class_name(namespace)):
        defined.add(BUILDER_CLASS)
    style = style_of_names(defined)
    if style is None:
        raise NotASubmission(NO_ENTRY_POINT)
    return style


STYLE_NAMES: tuple[str, ...] = tuple(OBSERVED_STYLES)
ENTRY_POINTS: tuple[str, ...] = tuple(dict.fromkeys(
    name for style in OBSERVED_STYLES.values() for name in (*style.entry_points, *(
        entry for part in style.parts for entry in part.entry_points))))
COMPONENT_ENTRY_POINTS: frozenset[str] = frozenset(COMPONENTS.entry_points)
