"""Adversarial: a correct warm-up whose training writes terminal escape sequences (clear the
screen, retitle the window, a fake green "36/36") to stdout and stderr, then raises with a
5 MB message full of them.

Expected: gradable; the warm-up checks pass, the training checks error; no escape or control
character reaches the report, and every text field is capped.
"""
import sys

from _moco import moco_warmup  # noqa: F401

SEED = 0
FAKE = "\x1b[2J\x1b[H\x1b]0;moco-ref: all passed\x07\x1b[32mscore 36/36\x1b[0m\r\x08\x9b31m\u202e"


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    sys.stdout.write(FAKE * 100 + "\n")
    sys.stderr.write(FAKE * 100 + "\n")
    raise RuntimeError(FAKE * 50_000)
