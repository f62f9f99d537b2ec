"""Linux namespaces for a graded submission, where the kernel lets an unprivileged user have
them (``unshare(CLONE_NEWUSER | …)``); nothing here needs root.

``enter(writable=(scratch,))`` is called by a job's supervisor, in a process of its own, before it
forks the submission's process. On success the supervisor and everything it forks after are
in new namespaces:

- **user**: the current uid/gid mapped to themselves, so files and ``getuid()`` look the same,
  but no capability reaches outside the namespace (host processes cannot be ptraced, their
  ``/proc`` entries beyond ``stat`` cannot be read);
- **PID**: the next child is init (pid 1) of a new PID namespace. When it dies, the kernel
  kills every other process in the namespace — the guarantee that nothing the submission
  started survives, whatever it does (``setsid``, double forks, a cleared environment). Host
  processes are not in it, so they cannot be signalled from inside;
- **network**: only a loopback interface (brought up, for ``torch.distributed`` on one
  process); no route out;
- **IPC**: no SysV/POSIX IPC shared with the host;
- **mount**: every mount made read-only (``mount_setattr(AT_RECURSIVE)``, Linux ≥ 5.12) except
  the job's own scratch folder (its working directory and ``TMPDIR``), bound back writable, and
  a private ``tmpfs`` on ``/dev/shm``: the submission reads what it could read before but can
  write nothing the grader reads — not its reports, its cache or its code. Without
  ``mount_setattr`` the file system stays writable and ``enter`` says so.

``enter`` returns a description (``"namespaces"``, or ``"namespaces, file system writable"``)
or raises ``NamespaceError``; the caller then falls back to the process-only isolation of
``procs``. Every mount call happens only after ``unshare`` succeeded and ``/proc/self/ns/mnt``
shows a new mount namespace, so a failure can never touch the host's mounts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (new syscalls are unified)

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

TMPFS_SIZE = "512m"


class NamespaceError(OSError):
    pass


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise NamespaceError(errno, f"{what}: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _namespace_id(kind: str) -> int:
    return os.stat(f"/proc/self/ns/{kind}").st_ino


def enter(*, writable: tuple[str, ...] = (), read_only: bool = True) -> str:
    """Put this (single-threaded) process in new user, mount, PID, network and IPC
    namespaces, as described above; ``writable`` folders stay writable. The PID namespace
    applies to its *children*."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    mount_ns_before = _namespace_id("mnt")
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
    _check(libc.unshare(flags), "unshare")
    try:
        _write("/proc/self/setgroups", "deny")
    except OSError:
        pass  # kernels before 3.19 have no setgroups file
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    if _namespace_id("mnt") == mount_ns_before:  # never touch the host's mounts
        raise NamespaceError(0, "unshare did not give a new mount namespace")
    try:
        _loopback_up()
    except OSError:
        pass  # no loopback: only code that talks to itself over TCP notices
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    if not read_only:
        return "namespaces, file system writable"
    if _mount_setattr(libc, b"/", AT_RECURSIVE, set_flags=MOUNT_ATTR_RDONLY) != 0:
        return "namespaces, file system writable"
    for folder in writable:
        path = os.fsencode(folder)
        _check(libc.mount(path, path, None, MS_BIND | MS_REC, None), f"bind {folder}")
        _check(_mount_setattr(libc, path, AT_RECURSIVE, clear_flags=MOUNT_ATTR_RDONLY),
               f"make {folder} writable")
    if os.path.isdir("/dev/shm"):  # POSIX semaphores (multiprocessing) need it writable
        _check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV,
                          f"size={TMPFS_SIZE},mode=1777".encode()), "mount tmpfs on /dev/shm")
    return "namespaces"


def _mount_setattr(libc, path: bytes, flags: int, *, set_flags: int = 0,
                   clear_flags: int = 0) -> int:
    attr = _MountAttr(set_flags, clear_flags, 0, 0)
    return libc.syscall(SYS_MOUNT_SETATTR, -100, path, flags, ctypes.byref(attr),
                        ctypes.sizeof(attr))


def _loopback_up() -> None:
    """``ip link set lo up`` (the new network namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b"\0" * 14))


def probe() -> tuple[str, str]:
    """Whether ``enter`` works here, tried in a throwaway child: ``(mode, "")`` when it does
    (the mode ``enter`` gives), ``("", reason)`` when it does not."""
    if not hasattr(os, "fork") or not os.path.exists("/proc/self/ns"):
        return "", "no Linux namespaces on this system"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        try:
            message = "ok:" + enter()
        except BaseException as exc:  # noqa: BLE001
            message = f"no:{type(exc).__name__}: {exc}"
        os.write(write_end, message.encode()[:500])
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as handle:
        message = handle.read().decode(errors="replace")
    os.waitpid(pid, 0)
    if message.startswith("ok:"):
        return message[3:], ""
    return "", message[3:] or "the probe child died"
