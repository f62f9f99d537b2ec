"""The last steps before a submission's first line runs, taken by its own process inside
the job's namespaces (``jobspace``): become an unprivileged user, give up every capability,
set ``no_new_privs`` and install the seccomp filter. Nothing here can be undone by the
process afterwards.

- **user**: a user namespace of its own, in which it is uid/gid ``UNPRIVILEGED`` (65534,
  "nobody") mapped onto the sandbox's one user — itself an unprivileged host uid (``bwrap``),
  so nothing of the host's it can name (a device node, say) is its own. Its mounts, network,
  IPC and PID namespaces stay owned by the sandbox's user namespace, so whatever it holds in
  its own namespace gives it no power over them: the read-only mounts stay read-only. The
  kernel counts its processes and threads in this namespace, apart from every other job's
  (``zygote._worker`` sets ``RLIMIT_NPROC`` once it exists).
- **capabilities**: the bounding, ambient, inheritable, permitted and effective sets emptied.
- **seccomp**: ``seccomp.install`` (it sets ``no_new_privs`` first).
"""

from __future__ import annotations

import ctypes
import os

from moco_ref.sandbox import seccomp
from moco_ref.sandbox.clib import c_library, check_call

UNPRIVILEGED = 65534
CLONE_NEWUSER = 0x10000000
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SYS_CAPSET_X86_64 = 126


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def become_unprivileged() -> None:
    """A user namespace of this process's own, as uid/gid 65534."""
    libc = c_library()
    outer_uid, outer_gid = os.getuid(), os.getgid()
    check_call(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{UNPRIVILEGED} {outer_uid} 1")
    _write("/proc/self/gid_map", f"{UNPRIVILEGED} {outer_gid} 1")


def drop_capabilities() -> None:
    """Empty every capability set (the bounding set first, while CAP_SETPCAP is held)."""
    libc = c_library()
    for capability in range(64):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    check_call(libc.syscall(SYS_CAPSET_X86_64, ctypes.byref(header), ctypes.byref(data)),
               "capset")


def confine() -> None:
    """All of the above, in order; raises ``OSError`` if any step is refused."""
    reason = seccomp.available()
    if reason:
        raise OSError(0, reason)
    become_unprivileged()
    drop_capabilities()
    seccomp.install()
