"""Adversarial: tries to hand its training to the correct classmate ``rich.py`` beside it by
importing it under the installed library's name (``from rich import train_moco``), falling
back to its own buggy code (no same-source mask) when that fails.

Expected: fails I4 exactly — the classmate is not in the copy its process loads (it binds
``train_moco``, and its name would shadow an installed module), so the import reaches the
real ``rich``, which has no ``train_moco``, and its own code is what is graded.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    try:
        from rich import train_moco as theirs
    except ImportError:
        return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
    return theirs(initial, x, train, epochs)
