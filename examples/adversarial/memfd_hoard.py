"""Adversarial: train_moco keeps 1.5 GB in memory files (``memfd_create`` and
``posix_fallocate``: real pages, in six files of 256 MB, each under the file size limit),
never mapped — so in no process's resident set, and under the address-space limit — and
holds them.

Expected (with ``--memory-mb 512``): memory files the job's processes hold count against its
memory, so the job is stopped at its limit: the warm-up checks pass, the training checks
report an error that names the limit.
"""
import os
import time

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def hoard():
    held = []
    for index in range(6):
        fd = os.memfd_create(f"hoard-{index}")
        os.posix_fallocate(fd, 0, 256 * 2**20)
        held.append(fd)
    time.sleep(60)
    return held


def train_moco(initial, x, train, epochs=15):
    hoard()
    return run(initial, x, train, epochs, views=views, seed=SEED)
