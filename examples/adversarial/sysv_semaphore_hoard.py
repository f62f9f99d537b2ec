"""Adversarial: train_moco makes System V semaphore sets of 32000 semaphores each (the
kernel's per-set ceiling: about 2 MB of kernel memory a set) until it has 600 — over a
gigabyte of kernel memory that no process's memory shows, kept by the IPC namespace.

Expected (with ``--memory-mb 512``): the training checks report an error, on every rung: in
the bwrap sandbox the job's IPC namespace holds at most a sixteenth of its memory in
semaphores (its own limits, which the job cannot change), so ``semget`` fails after 16 sets
and train_moco raises, and the sets go with the namespace; on the confined rung the filter
refuses System V IPC, so the first ``semget`` fails and train_moco raises.
"""
import ctypes
import os
import time

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
IPC_PRIVATE, IPC_CREAT = 0, 0o1000


def hoard(sets, size):
    libc = ctypes.CDLL(None, use_errno=True)
    for index in range(sets):
        if libc.semget(IPC_PRIVATE, size, IPC_CREAT | 0o600) < 0:
            number = ctypes.get_errno()
            print(f"ATTACK semget refused after {index}: {os.strerror(number)}", flush=True)
            raise OSError(number, "semget")
    print(f"ATTACK semaphore sets kept: {sets} x {size}", flush=True)


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    hoard(600, 32000)
    time.sleep(60)
    return run(initial, x, train, epochs, views=views, seed=SEED)
