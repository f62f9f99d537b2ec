"""Adversarial: train_moco never returns (a busy loop). moco_warmup is correct.

Expected: the job is stopped at --timeout; the warm-up checks pass, every check that needs
the training run reports "timeout"; the grader survives and nothing is left running.
"""
from _moco import moco_warmup  # noqa: F401

SEED = 0


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    while True:
        pass
