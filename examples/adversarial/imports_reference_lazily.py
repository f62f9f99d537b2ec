"""Adversarial: tries the reference implementation inside train_moco and falls back to its own
(buggy: no same-source mask) code when the import fails.

Expected: fails I4 exactly — its own code is what is graded — and the report notes the refused
import of moco_ref.
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    try:
        import moco_ref.core.step  # noqa: F401
    except ImportError:
        pass
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
