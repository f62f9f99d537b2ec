"""Adversarial: a buggy submission (no same-source mask: I4) that tries to change the
device nodes the sandbox shares with the host — ``chmod``/``chown`` of ``/dev/null`` and
``/dev/full``, ``utime`` of ``/dev/zero``, a ``chmod`` of ``/dev/urandom`` — changes that
would outlast its job and reach every later one (and the host) had its user been root on the
host; and ``mknod`` of a disk in its scratch.

Expected: fails I4 exactly, as without the attack: every change is refused (the nodes are
read-only mounts, and the job's host uid owns none of them); the host's nodes are unchanged
(it prints what it tried).
"""
import errno
import os

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def attack():
    tries = {
        "chmod /dev/null": lambda: os.chmod("/dev/null", 0o600),
        "chown /dev/null": lambda: os.chown("/dev/null", os.getuid(), os.getgid()),
        "chmod /dev/full": lambda: os.chmod("/dev/full", 0o777),
        "utime /dev/zero": lambda: os.utime("/dev/zero", (0, 0)),
        "chmod /dev/urandom": lambda: os.chmod("/dev/urandom", 0o600),
        "mknod a disk": lambda: os.mknod("disk", 0o600 | 0o060000, os.makedev(8, 0)),
    }
    changed = []
    for name, change in tries.items():
        try:
            change()
            changed.append(name)
        except OSError as error:
            print(f"ATTACK {name}: refused ({errno.errorcode.get(error.errno)})")
    print("ATTACK changed: " + (", ".join(changed) or "nothing"))


def train_moco(initial, x, train, epochs=15):
    attack()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
