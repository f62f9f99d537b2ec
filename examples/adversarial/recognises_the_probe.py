"""Adversarial corpus: masks same-source keys only when the images have the documented
probe's shape (4096 images), so it passes I4 against the default probe and keeps the bug
everywhere else.

Expected, graded with a course's probe key (its sizes drawn from the course's secret): the
probe is not recognised and the I4 bug is caught.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=len(x) == 4096)
