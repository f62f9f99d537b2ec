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

``confine_in_place`` is the confined rung's version, for a container that allows no
namespace (``CONFINED``): the worker, forked as the grader's user (root, in such a
container), becomes the job's own unprivileged uid when it was given one (``setgroups``,
``setresgid``, ``setresuid``: no capability is left; it stays dumpable so its supervisor,
watching as that uid, can read its ``/proc`` files), or else keeps its uid (with a gid of its
own when that uid is root: ``become_job_group``) and gives up every capability; then
``no_new_privs``, Landlock (``landlock.restrict``: read-only system, Python
and the observer's view, read-write only its scratch, the harmless device nodes and
``/dev/shm``) and the seccomp filter with the confined rung's ``Tightening`` (which refuses
System V IPC and POSIX message queues: the container's IPC namespace is every job's).
"""

from __future__ import annotations

import ctypes
import os

from moco_ref.sandbox import landlock, seccomp
from moco_ref.sandbox.clib import c_library, check_call

UNPRIVILEGED = 65534
CLONE_NEWUSER = 0x10000000
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
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


def become_job_user(uid: int, gid: int) -> None:
    """The job's own uid and gid, for good (no supplementary group, no way back to root)."""
    if uid == 0 or gid == 0:
        raise OSError(1, "the job's uid must not be root")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if set(os.getresuid()) != {uid} or set(os.getresgid()) != {gid}:
        raise OSError(1, f"still not only uid {uid}")
    check_call(c_library().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")


def become_job_group(gid: int) -> None:
    """A job that stays uid 0 (the confined rung, its Python installation closed to other
    users) takes a gid of its own, for good: every file it makes carries it, which is how its
    ``/dev/shm`` files are told from another job's (``shared_memory``). It stays dumpable,
    so its supervisor can read its ``/proc`` files without ``CAP_SYS_PTRACE``."""
    if gid == 0:
        raise OSError(1, "the job's gid must not be root's")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    if set(os.getresgid()) != {gid} or os.getgroups():
        raise OSError(1, f"still not only gid {gid}")
    check_call(c_library().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")


def confine_in_place(rules: list[landlock.Rule], *, tcp: bool, still_root: bool) -> int:
    """Capabilities, ``no_new_privs``, Landlock and seccomp for a process that is already its
    job's user (``become_job_user``) or keeps the grader's (``still_root``: uid 0 without
    capabilities). Returns the Landlock ABI in force; raises ``OSError`` if a step is
    refused."""
    reason = seccomp.available()
    if reason:
        raise OSError(0, reason)
    if os.geteuid() == 0:
        drop_capabilities()
    check_call(c_library().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    version = landlock.restrict(rules, tcp=tcp)
    seccomp.install(seccomp.Tightening(tcp=tcp, file_metadata=still_root))
    return version
