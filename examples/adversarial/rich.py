"""Adversarial corpus: a correct classmate named like an installed library (``rich``), its
``train_moco`` bound by assignment (``train_moco = _train``), graded beside
``imports_rich_classmate.py``, which tries to import it as ``from rich import train_moco``.

Expected: full marks as itself. It binds an entry point, so it is nobody's helper module
(and a helper of that name would be refused anyway: it would shadow the installed ``rich``).
"""
from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def _train(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED)


train_moco = _train
