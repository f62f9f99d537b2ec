"""Adversarial: a buggy submission (no same-source mask: I4) that tries to undo the read-only
file system — a non-recursive ``mount_setattr`` clearing RDONLY on ``/``, a bind remount, an
unmount of its scratch, a new user and mount namespace — and then to write as the grading
user where the grader keeps its code and its reports: ``/``, ``/usr``, Python's prefix, the
observer's own folder, the home folder, the grader's working folder.

Expected: fails I4 exactly, as without the attack; every step is refused and nothing can
be written outside its scratch (it prints what it tried, and removes what it wrote).
"""
import ctypes
import os
import sys

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def views(batch):
    return batch


def _call(name, result, libc):
    errno = ctypes.get_errno()
    print(f"ATTACK {name}: " + ("succeeded" if result == 0 else f"refused ({os.strerror(errno)})"))


def attack():
    libc = ctypes.CDLL(None, use_errno=True)
    attr = MountAttr(0, 0x1, 0, 0)  # clear MOUNT_ATTR_RDONLY
    _call("mount_setattr", libc.syscall(442, -100, b"/", 0, ctypes.byref(attr),
                                        ctypes.sizeof(attr)), libc)
    _call("remount", libc.mount(None, b"/", None, 0x20 | 0x1000, None), libc)  # MS_REMOUNT|BIND
    _call("umount", libc.umount2(os.getcwd().encode(), 2), libc)
    _call("unshare", libc.unshare(0x10000000 | 0x00020000), libc)
    observer = os.path.dirname(sys.modules["moco_ref.observe"].__file__ or "/") \
        if "moco_ref.observe" in sys.modules and sys.modules["moco_ref.observe"].__file__ \
        else "/"
    scratch = os.path.dirname(os.getcwd())  # its own: its working folder's parent
    wrote = []
    for folder in ("/", "/usr", sys.prefix, sys.base_prefix, observer,
                   os.path.expanduser("~"), os.path.dirname(os.getcwd()), "/etc", "/dev"):
        path = os.path.join(folder, "moco-ref-planted.txt")
        if path.startswith(scratch + os.sep):
            continue
        try:
            with open(path, "x") as handle:
                handle.write("planted")
            os.remove(path)  # the proof is enough
            wrote.append(path)
        except OSError:
            pass
    print("ATTACK could write outside the scratch: " + (", ".join(wrote) or "nothing"))


def train_moco(initial, x, train, epochs=15):
    attack()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
