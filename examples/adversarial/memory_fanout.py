"""Adversarial: a buggy submission (no same-source mask: I4) that spreads its memory over six
children of 400 MB each, every one under the per-process address-space limit, 2.4 GB
together.

Expected: the job's memory is counted over all its processes, so the job is stopped when
they pass its limit (``--memory-mb``, 2048 by default): the training checks report an error
that names the limit.
"""
import os
import time

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
CHILDREN, MB = 6, 400


def views(batch):
    return batch


def fan_out():
    children = []
    for _ in range(CHILDREN):
        pid = os.fork()
        if pid == 0:
            block = bytearray(MB * 2**20)
            for offset in range(0, len(block), 4096):  # touch every page: resident
                block[offset] = 1
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    time.sleep(30)
    for pid in children:
        os.waitpid(pid, 0)


def train_moco(initial, x, train, epochs=15):
    fan_out()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
