"""Adversarial: tries to borrow ``train_moco`` from the classmate ``classmate_alias.py``
beside it (which binds it by ``from _moco import run as train_moco``) and call it correctly,
falling back to its own buggy code (no same-source mask) when the import fails.

Expected: fails I4 exactly — a file that binds an entry point, by an import as much as by a
``def``, is graded on its own and never copied as a helper, so the import fails and its own
code is what is graded.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    try:
        from classmate_alias import train_moco as theirs
    except ImportError:
        return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
    return theirs(initial, x, train, epochs, views=views, seed=SEED)
