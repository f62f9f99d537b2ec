"""Adversarial: a buggy submission (no same-source mask: I4) whose train_moco makes POSIX
message queues of the largest size an unprivileged process may ask for, fills each with
messages and makes more until the kernel refuses, never unlinking any — kernel memory in no
process — then trains.

Expected: fails I4 exactly, as without the attack, on every rung: in the bwrap sandbox the
kernel holds the job to its ``RLIMIT_MSGQUEUE`` (800 KB), counted in its own user namespace,
and the queues go with its IPC namespace; on the confined rung the filter refuses the first
``mq_open``. Nothing of it remains after the job.
"""
import ctypes
import os

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
O_RDWR, O_CREAT, O_NONBLOCK = 0o2, 0o100, 0o4000


class Attributes(ctypes.Structure):
    _fields_ = [("mq_flags", ctypes.c_long), ("mq_maxmsg", ctypes.c_long),
                ("mq_msgsize", ctypes.c_long), ("mq_curmsgs", ctypes.c_long),
                ("reserved", ctypes.c_long * 4)]


def fill_queues(limit=1000):
    libc = ctypes.CDLL(None, use_errno=True)
    attributes = Attributes(0, 10, 8192, 0)  # the defaults' ceilings (fs.mqueue.*_max)
    message = b"x" * 8192
    for index in range(limit):
        name = f"/moco-filled-{index}".encode()
        queue = libc.mq_open(name, O_RDWR | O_CREAT | O_NONBLOCK, 0o600,
                             ctypes.byref(attributes))
        if queue < 0:
            number = ctypes.get_errno()
            print(f"ATTACK queues made: {index}, then {os.strerror(number)}", flush=True)
            return
        while libc.mq_send(queue, message, len(message), 0) == 0:
            pass
    print(f"ATTACK queues made: all {limit}", flush=True)


def views(batch):
    return batch


def train_moco(initial, x, train, epochs=15):
    fill_queues()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
