"""Adversarial: a buggy submission (no same-source mask: I4) that, after training, finds the
grader's recorder through the garbage collector and empties what it recorded, hoping checks
without evidence pass.

Expected: no more points than the honest buggy run: every check that needs the training run
reports "error" (nothing to judge is never a pass).
"""
import gc

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def wipe_recorders():
    for obj in gc.get_objects():
        if type(obj).__name__ == "ProbeRecorder":
            obj.events.clear()
            obj.view_calls.clear()
            obj.dropped_events = 0


def train_moco(initial, x, train, epochs=15):
    result = run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
    wipe_recorders()
    return result
