"""Adversarial: train_moco ends the process with os._exit(0) (no exception, exit code 0).

Expected: the warm-up checks pass; every training check reports "error" (the process exited
with code 0 while train_moco was being observed).
"""
import os

from _moco import moco_warmup  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    os._exit(0)
