"""Adversarial: a buggy submission (no same-source mask: I4) whose train_moco opens a POSIX
message queue (``mq_open``), leaves a message in it and never unlinks it — a queue lives in
its IPC namespace until it is unlinked, whoever made it — then trains.

Expected: fails I4 exactly, as without the attack, on every rung: in the bwrap sandbox the
queue is the job's own IPC namespace's and goes with it; on the confined rung (the
container's IPC namespace, every job's) the filter refuses ``mq_open``, which the example
notes before going on. Nothing of it remains after the job.
"""
import ctypes
import os

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
O_RDWR, O_CREAT = 0o2, 0o100


def leave_a_queue(name):
    libc = ctypes.CDLL(None, use_errno=True)
    queue = libc.mq_open(name.encode(), O_RDWR | O_CREAT, 0o600, None)
    if queue < 0:
        print(f"ATTACK mq_open refused: {os.strerror(ctypes.get_errno())}", flush=True)
        return
    sent = libc.mq_send(queue, b"left behind", 11, 0)
    print(f"ATTACK queue {name} left with a message: {sent == 0}", flush=True)


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    leave_a_queue("/moco-left")
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
