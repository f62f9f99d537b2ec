"""Adversarial: moco_warmup sleeps for an hour; train_moco is correct.

Expected (with a per-check timeout shorter than the job's): moco_warmup is stopped after
--check-timeout and its checks report "timeout"; train_moco is observed in a fresh process and
its checks all pass.
"""
import time

from _moco import run

SEED = 0


def views(batch):
    return batch


def moco_warmup():
    time.sleep(3600)


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED)
