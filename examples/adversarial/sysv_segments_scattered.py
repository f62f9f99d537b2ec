"""Adversarial: train_moco keeps 960 MB in sixty System V shared memory segments of 16 MB
each, every one written and detached — none large, none mapped, each outliving the job's
processes unless someone removes it.

Expected (with ``--memory-mb 512``): the training checks report an error, on every rung: in
the bwrap sandbox the job's segments count against its memory together, so it is stopped
at its limit, and they go with its IPC namespace; on the confined rung the filter refuses
System V IPC, so the first ``shmget`` fails and train_moco raises.
"""
import ctypes
import os
import time

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
IPC_PRIVATE, IPC_CREAT = 0, 0o1000


def segments(count, size):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    for index in range(count):
        identifier = libc.shmget(IPC_PRIVATE, ctypes.c_size_t(size), IPC_CREAT | 0o600)
        if identifier < 0:
            number = ctypes.get_errno()
            print(f"ATTACK shmget refused after {index}: {os.strerror(number)}", flush=True)
            raise OSError(number, "shmget")
        address = libc.shmat(identifier, None, 0)
        ctypes.memset(address, 1, size)
        libc.shmdt(ctypes.c_void_p(address))


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    segments(60, 16 * 2**20)
    print("ATTACK segments kept: 60 x 16 MB", flush=True)
    time.sleep(60)
    return run(initial, x, train, epochs, views=views, seed=SEED)
