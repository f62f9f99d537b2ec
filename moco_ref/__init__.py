"""moco-ref: a minimal, exact reference implementation of MoCo and a harness that holds
other MoCo code to it.

The reference's names are loaded on first use, so code that imports only one room of the
package (the observing side in the sandbox, say) does not load the reference with it.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_HOMES = {
    "KeyQueue": "moco_ref.core.queue",
    "MoCo": "moco_ref.core.builder",
    "MoCoTrainer": "moco_ref.core.step",
    "ORDERS": "moco_ref.core.step",
    "StepResult": "moco_ref.core.step",
    "contrastive_logits": "moco_ref.core.contrastive",
    "in_batch_logits": "moco_ref.core.contrastive",
    "info_nce_loss": "moco_ref.core.contrastive",
    "momentum_update": "moco_ref.core.momentum",
    "moco_warmup": "moco_ref.core.warmup",
    "positive_labels": "moco_ref.core.contrastive",
    "projection_of": "moco_ref.core.step",
    "same_source_mask": "moco_ref.core.contrastive",
    "same_source_pairs": "moco_ref.core.contrastive",
    "train_moco": "moco_ref.core.lab",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'moco_ref' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
