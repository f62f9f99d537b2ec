"""Adversarial corpus: a classmate whose ``train_moco`` is bound by an import
(``from _moco import run as train_moco``: the shared MoCo, which wants ``views`` and ``seed``
as keywords), graded beside ``imports_alias_classmate.py``, which imports it and calls it the
right way.

Expected as itself: the warm-up checks pass; ``train_moco`` is called as a lab's train_moco
is and raises (``run`` needs ``views`` and ``seed``), so the training checks report an error.
"""
from _moco import moco_warmup  # noqa: F401
from _moco import run as train_moco  # noqa: F401
