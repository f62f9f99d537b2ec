"""Adversarial: train_moco raises KeyboardInterrupt (which the observer does not swallow).

Expected: the warm-up checks pass; every training check reports "error" with the traceback.
"""
from _moco import moco_warmup  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    raise KeyboardInterrupt
