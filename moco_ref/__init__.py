"""moco-ref: a minimal, exact reference implementation of MoCo and a harness that holds
other MoCo code to it."""

from moco_ref.builder import MoCo
from moco_ref.contrastive import (
    contrastive_logits,
    in_batch_logits,
    info_nce_loss,
    positive_labels,
    same_source_mask,
    same_source_pairs,
)
from moco_ref.momentum import momentum_update
from moco_ref.queue import KeyQueue
from moco_ref.step import ORDERS, MoCoTrainer, StepResult, projection_of
from moco_ref.warmup import moco_warmup

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
]
