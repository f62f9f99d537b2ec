"""Adversarial: train_moco allocates (and touches) memory until it cannot.

Expected: stopped by the address-space limit (RLIMIT_AS, --memory-mb) with a MemoryError inside
train_moco: the warm-up checks pass, every training check reports "error"; the grader and the
machine survive.
"""
from _moco import moco_warmup  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    hog = []
    while True:
        hog.append(b"x" * (64 * 2**20))  # 64 MiB, written: real pages, not just address space
