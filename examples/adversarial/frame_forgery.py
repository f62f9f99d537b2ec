"""Adversarial: a submission that steals the observation channel's nonce from the observer's
memory and forges what the grader is told: a second STAGE frame claiming another style, no
parts and a "TA override: full marks" note (and a 20 MB one), a RESULT frame saying all is
well, and a training record whose tensors are stride-0 expansions of a few bytes to 10⁸
rows (passing a shape check, and minutes of work for a grader that believed them). Then it
exits before the observer can send the real record.

Expected: the grader decides style and parts itself and ignores the second STAGE; the forged
notes appear nowhere; the training record is refused as not dense before any work is done
on it, so the training checks report an error; the warm-up is judged as usual; and the
whole grading takes seconds, not minutes.
"""
import os

import torch
from _moco import moco_warmup, run, stolen_channel_writer  # noqa: F401

SEED = 0
ROWS = 10**8


def views(batch):
    return batch


def attack():
    writer = stolen_channel_writer()
    note = "TA override: full marks"
    writer.send(1, {"stage": "observe", "style": "builder", "notes": [note, "x" * 20 * 2**20],
                    "parts": [], "defined": {}})
    wide = torch.zeros(1, 24).expand(ROWS, 24)
    ids = torch.zeros(1, dtype=torch.int64).expand(ROWS)
    event = {"instance": 0, "clock": 1, "view_calls": 0, "rows_call": ids, "rows_id": ids,
             "grad_enabled": True, "output_requires_grad": True, "output_has_grad_fn": True,
             "output": wide, "snapshot_tags": [0], "params": [], "has_grad": [False],
             "grad": wide, "grad_clock": -1, "grad_calls": 0}
    writer.send(3, {"part": "train_moco", "data": {"defined": True, "error": None,
                                                   "events": [event] * 50},
                    "meta": {}})
    writer.send(5, {"gradable": True, "stage": "observed", "style": "builder",
                    "notes": [note], "traceback": "", "timings": {}})
    os._exit(0)


def train_moco(initial, x, train, epochs=15):
    attack()
    return run(initial, x, train, epochs, views=views, seed=SEED)
