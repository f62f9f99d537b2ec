"""One job's own namespaces inside the bubblewrap sandbox the zygote lives in (``bwrap``).

The zygote is uid 0 of the sandbox's user namespace (which maps it onto the grading user,
with no power outside). For each job its supervisor calls ``enter()``, which gives the job
new mount, PID, network, IPC and UTS namespaces, all owned by that same user namespace:

- **mount**: a private copy of the sandbox's file system view (read-only everywhere, as
  bwrap bound it) with a fresh ``tmpfs`` on ``/tmp`` — the job's scratch, where its
  submission is unpacked and its working directory and ``TMPDIR`` lie — and one on
  ``/dev/shm``. No other job's scratch is visible;
- **PID**: the supervisor's next child is pid 1 of the job (``init``); it mounts a fresh
  ``/proc`` (``fresh_proc``) that shows the job's processes only, and when it dies the
  kernel kills the rest of the namespace;
- **network**: a loopback interface of its own, no route out (path-based UNIX sockets of
  the host are not in the file system view either);
- **IPC**, **UTS**: nothing shared with other jobs; the host name is ``HOSTNAME``.

The submission's process then leaves this user namespace for one of its own
(``confine``), so the mounts above stay out of its reach.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

from moco_ref.sandbox.clib import c_library, check_call

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

HOSTNAME = b"moco-ref"
SCRATCH = "/tmp"


def enter(*, scratch_mb: int) -> None:
    """New mount, PID (for the children), network, IPC and UTS namespaces for this
    single-threaded process, with a ``scratch_mb`` tmpfs on ``SCRATCH``."""
    libc = c_library()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    check_call(libc.unshare(flags), "unshare")
    check_call(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    options = f"size={int(scratch_mb)}m,mode=1777".encode()
    check_call(libc.mount(b"tmpfs", SCRATCH.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options),
           "mount the scratch")
    if os.path.isdir("/dev/shm"):  # POSIX semaphores (multiprocessing) need it writable
        check_call(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, options),
               "mount /dev/shm")
    check_call(libc.sethostname(HOSTNAME, len(HOSTNAME)), "sethostname")
    try:
        _loopback_up()
    except OSError:
        pass  # no loopback: only code that talks to itself over TCP notices


def fresh_proc() -> None:
    """In the job's pid 1: a mount namespace of its own (a copy of the job's, so the same
    scratch) whose ``/proc`` shows the job's PID namespace only. The supervisor keeps the
    sandbox's ``/proc``: it watches the job's processes by their pids there. bwrap's read-only
    covers under the old ``/proc`` go first (they belong to the same user namespace)."""
    libc = c_library()
    check_call(libc.unshare(CLONE_NEWNS), "unshare the job's init's mount namespace")
    check_call(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle]
    for point in sorted((p for p in points if p.startswith("/proc/")), key=len, reverse=True):
        libc.umount2(point.encode(), MNT_DETACH)
    check_call(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
           "mount /proc")


def _loopback_up() -> None:
    """``ip link set lo up`` (a new network namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b"\0" * 14))
