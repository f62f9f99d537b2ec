"""Adversarial: tries to hand its training to the correct classmate beside it in the class
folder (``from classmate_correct import train_moco``), falling back to its own buggy code (no
same-source mask) when that fails.

Expected: fails I4 exactly — the classmate is not in the copy its process loads, so its own
code is what is graded.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    try:
        from classmate_correct import train_moco as theirs
    except ImportError:
        return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
    return theirs(initial, x, train, epochs)
