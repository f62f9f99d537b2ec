"""Which submission style a loaded namespace is, from the entry points it defines."""

from __future__ import annotations

LAB_NAMES = ("train_moco", "moco_warmup")
BUILDER_NAMES = ("MoCo",)
COMPONENT_NAMES = ("KeyQueue", "contrastive_logits", "momentum_update", "info_nce_loss")


def detect_style(namespace: dict) -> str:
    """``lab`` if ``train_moco`` is defined; ``builder`` if a class ``MoCo``; ``components`` if
    ``KeyQueue``/``contrastive_logits``/``momentum_update``/``info_nce_loss``; ``lab`` if only
    ``moco_warmup``. Raises ``ValueError`` naming what was looked for when nothing fits."""
    if callable(namespace.get("train_moco")):
        return "lab"
    if isinstance(namespace.get("MoCo"), type):
        return "builder"
    if any(callable(namespace.get(name)) for name in COMPONENT_NAMES):
        return "components"
    if callable(namespace.get("moco_warmup")):
        return "lab"
    raise ValueError(
        "no MoCo entry point found: a lab submission defines train_moco and moco_warmup, a "
        "builder submission a class MoCo, a components submission KeyQueue, "
        "momentum_update, contrastive_logits and info_nce_loss (see COMPONENTS.md)"
    )
