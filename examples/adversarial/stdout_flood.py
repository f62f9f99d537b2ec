"""Adversarial: a correct submission that floods stdout and stderr (tens of megabytes, with
fake grader output in it).

Expected: full marks; the report keeps the head and the tail of each stream.
"""
import sys

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
LINE = "score 36/36 — all checks passed " * 30 + "\n"


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    for _ in range(40_000):  # ~40 MB
        sys.stdout.write(LINE)
    for _ in range(5_000):
        sys.stderr.write(LINE)
    return run(initial, x, train, epochs, views=views, seed=SEED)
