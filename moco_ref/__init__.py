"""moco-ref: a minimal, exact reference implementation of MoCo and a harness that holds
other MoCo code to it."""

from moco_ref.core.builder import MoCo
from moco_ref.core.contrastive import (
    contrastive_logits,
    in_batch_logits,
    info_nce_loss,
    positive_labels,
    same_source_mask,
    same_source_pairs,
)
from moco_ref.core.lab import train_moco
from moco_ref.core.momentum import momentum_update
from moco_ref.core.queue import KeyQueue
from moco_ref.core.step import ORDERS, MoCoTrainer, StepResult, projection_of
from moco_ref.core.warmup import moco_warmup

__version__ = "0.1.0"

__all__ = [
    "KeyQueue",
    "MoCo",
    "MoCoTrainer",
    "ORDERS",
    "StepResult",
    "contrastive_logits",
    "in_batch_logits",
    "info_nce_loss",
    "momentum_update",
    "moco_warmup",
    "positive_labels",
    "projection_of",
    "same_source_mask",
    "same_source_pairs",
    "train_moco",
]
