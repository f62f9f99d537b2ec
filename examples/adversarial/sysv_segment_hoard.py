"""Adversarial: train_moco keeps 900 MB in one System V shared memory segment (``shmget``,
written through an attachment, then detached: no process maps it, so it is in no resident
set, and the segment outlives its processes until someone removes it).

Expected (with ``--memory-mb 512``): the training checks report an error, on every rung. In
the bwrap sandbox the job has an IPC namespace of its own, whose limits allow no segment
larger than the job's whole memory: ``shmget`` fails and train_moco raises (segments within
it count against its memory, and go with the namespace). On the
confined rung (no namespaces: the container's IPC namespace is every job's) the filter refuses
System V IPC, so ``shmget`` fails and train_moco raises.
"""
import ctypes
import os
import time

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
IPC_PRIVATE, IPC_CREAT = 0, 0o1000


def segment(size):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    identifier = libc.shmget(IPC_PRIVATE, ctypes.c_size_t(size), IPC_CREAT | 0o600)
    if identifier < 0:
        number = ctypes.get_errno()
        print(f"ATTACK shmget refused: {os.strerror(number)}", flush=True)
        raise OSError(number, "shmget")
    address = libc.shmat(identifier, None, 0)
    ctypes.memset(address, 1, size)  # real pages
    libc.shmdt(ctypes.c_void_p(address))
    return identifier


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    segment(900 * 2**20)
    print("ATTACK segment kept: 900 MB", flush=True)
    time.sleep(60)
    return run(initial, x, train, epochs, views=views, seed=SEED)
