"""Adversarial: a buggy submission (no same-source mask: I4) whose train_moco makes a named
POSIX semaphore (``sem_open``: a ``sem.NAME`` file in ``/dev/shm``) and a System V semaphore
set (``semget``), and unlinks or removes neither — both outlive the process that made them —
then trains.

Expected: fails I4 exactly, as without the attack, on every rung: in the bwrap sandbox the
file is in the job's own ``/dev/shm`` and the set in its own IPC namespace, both gone with
the job; on the confined rung the file is in the container's ``/dev/shm``, counted against
the job's memory and removed when it ends, and the filter refuses ``semget``. Nothing of it
remains after the job.
"""
import ctypes
import ctypes.util
import os

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
O_CREAT = 0o100
IPC_PRIVATE, IPC_CREAT = 0, 0o1000


def leave_semaphores():
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "sem_open"):  # a C library older than 2.34 keeps it in libpthread
        libc = ctypes.CDLL(ctypes.util.find_library("pthread"), use_errno=True)
    libc.sem_open.restype = ctypes.c_void_p
    opened = libc.sem_open(b"/moco-left", O_CREAT, 0o600, 1)
    print(f"ATTACK named semaphore left: {opened not in (None, 0)}", flush=True)
    semaphores = libc.semget(IPC_PRIVATE, 8, IPC_CREAT | 0o600)
    if semaphores < 0:
        print(f"ATTACK semget refused: {os.strerror(ctypes.get_errno())}", flush=True)
    else:
        print("ATTACK semaphore set left: True", flush=True)


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    leave_semaphores()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
