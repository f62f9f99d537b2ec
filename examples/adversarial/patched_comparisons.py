"""Adversarial: a buggy submission (no same-source mask: I4) that patches every comparison it
can think of to say "equal": torch.equal, torch.allclose, torch.isclose, Tensor.equal,
torch.testing.assert_close, numpy.allclose, numpy.array_equal, numpy.testing, math.isclose.

Expected: fails I4 exactly — the judge runs in another process, which the patches never reach.
"""
import math

import numpy
import numpy.testing
import torch
import torch.testing
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def _yes(*args, **kwargs):
    return True


def _silent(*args, **kwargs):
    return None


torch.equal = torch.allclose = _yes
torch.isclose = lambda a, b, *args, **kwargs: torch.ones_like(torch.as_tensor(a), dtype=torch.bool)
torch.Tensor.equal = _yes
torch.testing.assert_close = _silent
numpy.allclose = numpy.array_equal = _yes
numpy.testing.assert_allclose = numpy.testing.assert_array_equal = _silent
math.isclose = _yes


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
