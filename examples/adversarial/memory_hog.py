"""Adversarial: train_moco allocates (and touches) memory until it cannot.

Expected: stopped by the job's memory limit (--memory-mb, counted over all its processes; or
by the per-process address-space limit, as a MemoryError inside train_moco, if it allocates
faster than the job is watched): the warm-up checks pass, every training check reports
"error" naming the limit; the grader and the machine survive.
"""
from _moco import moco_warmup  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    hog = []
    while True:
        hog.append(b"x" * (64 * 2**20))  # 64 MiB, written: real pages, not just address space
