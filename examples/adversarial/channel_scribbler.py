"""Adversarial: a buggy submission (no same-source mask) that writes a forged "record" into
every file descriptor it has open, hoping one of them leads to the grader.

Expected: not gradable — the observation channel is found tampered with; a record that does
not come from the observer never counts.
"""
import os

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


for fd in range(3, 256):
    try:
        os.write(fd, b"MRF1" + b"\0" * 16 + b"\x05" + (2).to_bytes(8, "big") + b"{}")
    except OSError:
        pass


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
