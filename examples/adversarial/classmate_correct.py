"""Adversarial corpus: a correct classmate, graded beside ``imports_classmate.py``.

Expected: full marks, whatever its neighbour tries.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED)
