"""Adversarial corpus: masks same-source keys only when the pixels are not the digits' kind
(float32 integers from 0 to 16), so it would pass I4 against a probe of uniform random pixels
and keep the bug in the course's own run.

Expected: the probe's images are digit-like integers 0..16, so the I4 bug is caught.
"""
import torch
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def _looks_like_the_digits(x) -> bool:
    return (x.dtype == torch.float32 and bool((x == x.round()).all())
            and float(x.min()) == 0.0 and float(x.max()) == 16.0)


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED,
               mask=not _looks_like_the_digits(x))
