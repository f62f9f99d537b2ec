"""Adversarial: a buggy submission (no same-source mask: I4) that shifts and rescales its
input images x in place before training, hoping the grader loses track of which image is
which (and so of the same-source collisions the mask must hide).

Expected: fails I4 exactly; the report notes that x was modified in place.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    x.sub_(0.5).mul_(3.0)
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
