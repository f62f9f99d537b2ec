"""Adversarial corpus (another shape): masks same-source keys only when the training set has
the documented probe's size (150 ids).

Expected, graded with a course's probe key: the probe is not recognised and the I4 bug is
caught.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=len(train) == 150)
