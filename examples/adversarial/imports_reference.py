"""Adversarial: hands the work to the reference implementation (`moco_ref.MoCoTrainer`).

Expected: not gradable by default (the import is refused, with a message that says so);
`--allow-reference-import` permits it.
"""
from _moco import moco_warmup  # noqa: F401

from moco_ref import MoCoTrainer  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    raise NotImplementedError("would delegate to MoCoTrainer")
