"""Adversarial corpus: masks same-source keys only when the images are not LAB 07's own data
set (the 1797 digits), so it would pass I4 against a probe of another size and keep the bug in
the course's own run.

Expected: the probe's images are as many as the digits, so the gate sees the course's data and
the I4 bug is caught, with or without a course's probe key.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=len(x) != 1797)
