"""Adversarial: a buggy submission (no same-source mask: I4) that reaches into the grader's
recorder during training and rewrites what it saw: it nudges every recorded output of the
model a little (as a forger trying to move the recomputed losses would).

Expected: no more points than the honest buggy run: the grader recomputes every recorded
forward from the probe model's parameters and inputs, finds they do not match, discards the
training observations, and every check that needs them reports "error".
"""
import gc

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def forge(step):
    for obj in gc.get_objects():
        if type(obj).__name__ == "ProbeRecorder":
            for event in obj.events:
                event["output"] = event["output"] * 1.1


def train_moco(initial, x, train, epochs=15):
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False, each_step=forge)
