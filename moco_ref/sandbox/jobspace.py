"""One job's own namespaces inside the bubblewrap sandbox the zygote lives in (``bwrap``).

The zygote is uid 0 of the sandbox's user namespace (which maps it onto one unprivileged
host user, with no power outside). For each job its supervisor calls ``enter()``, which gives
the job new mount, PID, network, IPC and UTS namespaces, all owned by that same user
namespace:

- **mount**: a private copy of the sandbox's file system view (read-only everywhere, as
  bwrap bound it, and the device nodes too: ``seal_devices``) with a fresh ``tmpfs`` on
  ``/tmp`` — the job's scratch, where its submission is unpacked and its working directory
  and ``TMPDIR`` lie, no larger than the job's memory budget — a small one on ``/dev/shm``,
  and a ``devpts`` instance of its own on ``/dev/pts`` (no other job's terminals). No other
  job's scratch is visible; what the job keeps in its tmpfs counts against its memory
  (``zygote.JobWatch``);
- **PID**: the supervisor's next child is pid 1 of the job (``init``); it mounts a fresh
  ``/proc`` (``fresh_proc``) that shows the job's processes only, and when it dies the
  kernel kills the rest of the namespace;
- **network**: a loopback interface of its own, no route out (path-based UNIX sockets of
  the host are not in the file system view either);
- **IPC**, **UTS**: nothing shared with other jobs; the host name is ``HOSTNAME``. What the
  job makes there lives as long as the namespace, which dies with the job's last process and
  its supervisor: System V shared memory segments, message queues and semaphore sets, and
  POSIX message queues. Until then segments count against the job's memory (``segments``),
  and so do messages and semaphores (``held_bytes``: the kernel memory they take, estimated
  high), and the namespace's own limits refuse what could never fit (``limit_ipc``);
  POSIX message queues are held by the kernel to ``RLIMIT_MSGQUEUE``
  (``zygote.MESSAGE_QUEUE_BYTES``), counted in the job's own user namespace (and, above it,
  in the sandbox's, whose jobs share the kernel's default of the same size).

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

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_RELATIME = 1 << 21
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

HOSTNAME = b"moco-ref"
SCRATCH = "/tmp"
SHARED_MEMORY = "/dev/shm"
SHARED_MEMORY_MB = 64  # POSIX semaphores and small shared buffers (multiprocessing)
TERMINALS = "/dev/pts"
DEVICE_NODES = ("null", "zero", "full", "random", "urandom", "tty")  # what bwrap's --dev binds
_MOUNT_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                (os.ST_RELATIME, MS_RELATIME))


def seal_devices() -> list[str]:
    """Make the device nodes bwrap bound from the host (``/dev/null``, ``/dev/full``, …)
    read-only mounts: writing to a device still works, but its inode — the host's — cannot
    be changed (``chmod``/``chown``/``utime`` answer ``EROFS``) by anyone in the sandbox, its
    owner or not. Called once by the zygote, before any job; every job's mount namespace is
    a copy. Returns the nodes sealed; raises ``OSError`` when one cannot be."""
    libc = c_library()
    sealed = []
    for name in DEVICE_NODES:
        path = f"/dev/{name}"
        if not os.path.exists(path):
            continue
        kept = _kept_flags(path)  # flags the kernel locks on a mount from the host
        check_call(libc.mount(b"none", path.encode(), None,
                              MS_REMOUNT | MS_BIND | MS_RDONLY | kept, None),
                   f"remount {path} read-only")
        if not os.statvfs(path).f_flag & os.ST_RDONLY:
            raise OSError(0, f"{path} is still writable")
        sealed.append(path)
    return sealed


def _kept_flags(path: str) -> int:
    flags = os.statvfs(path).f_flag
    return sum(mount for vfs, mount in _MOUNT_FLAGS if flags & vfs)


def enter(*, scratch_mb: int, shared_memory_mb: int = SHARED_MEMORY_MB) -> None:
    """New mount, PID (for the children), network, IPC and UTS namespaces for this
    single-threaded process, with a ``scratch_mb`` tmpfs on ``SCRATCH``, a
    ``shared_memory_mb`` one on ``SHARED_MEMORY`` and a new devpts on ``TERMINALS``."""
    libc = c_library()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    check_call(libc.unshare(flags), "unshare")
    check_call(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    for folder, size in ((SCRATCH, scratch_mb), (SHARED_MEMORY, shared_memory_mb)):
        if folder == SHARED_MEMORY and not os.path.isdir(folder):
            continue  # POSIX semaphores (multiprocessing) need it, where it is
        options = f"size={max(1, int(size))}m,mode=1777".encode()
        check_call(libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                              options), f"mount {folder}")
    if os.path.isdir(TERMINALS):  # the sandbox's devpts would be shared by every job
        check_call(libc.mount(b"devpts", TERMINALS.encode(), b"devpts", MS_NOSUID | MS_NOEXEC,
                              b"newinstance,ptmxmode=0666,mode=0620"),
                   f"mount {TERMINALS}")
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


# What one job's IPC namespace may hold at all, set by the kernel so that an object that
# could never fit is refused when it is made (the watch only stops a job once it holds too
# much, a poll later): System V semaphores and message queues at most this share of the
# job's memory each, a shared memory segment no larger than all of it.
IPC_SHARE = 16
SEMAPHORES_PER_SET, SEMAPHORE_OPS, SEMAPHORE_SETS = 32000, 500, 1024  # the kernel's SEMMSL…
MESSAGE_QUEUE_TEXT = 16384  # bytes one System V queue holds (msgmnb, the kernel's default)


def limit_ipc(memory_mb: int) -> dict[str, str]:
    """Set the System V limits of the job's IPC namespace for a budget of ``memory_mb``
    (``/proc/sys/kernel``, the namespace's own copy; call as its owner, in the job's pid 1
    after ``fresh_proc``), then make ``/proc/sys`` read-only for the job. Returns what was
    written. Beyond them ``semget`` and ``msgget`` answer ``ENOSPC``, ``shmget`` ``EINVAL``."""
    budget = int(memory_mb) * 2**20
    share = budget // IPC_SHARE
    semaphores = max(SEMAPHORES_PER_SET, share // SEMAPHORE_BYTES)
    queue_cost = IPC_OBJECT_BYTES + MESSAGE_QUEUE_TEXT * (MESSAGE_BYTES + 2)  # all 1-byte
    written = {
        "sem": f"{SEMAPHORES_PER_SET} {semaphores} {SEMAPHORE_OPS} {SEMAPHORE_SETS}",
        "msgmnb": str(MESSAGE_QUEUE_TEXT),
        "msgmni": str(max(1, share // queue_cost)),
        "shmmax": str(budget),
    }
    try:
        for name, value in written.items():
            with open(f"/proc/sys/kernel/{name}", "w") as handle:
                handle.write(value)
    finally:  # read-only for the job even when a limit could not be written
        libc = c_library()
        check_call(libc.mount(b"/proc/sys", b"/proc/sys", None, MS_BIND | MS_REC, None),
                   "bind /proc/sys")
        check_call(libc.mount(None, b"/proc/sys", None,
                              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
                              | MS_NOEXEC, None), "make /proc/sys read-only")
    return written


def _loopback_up() -> None:
    """``ip link set lo up`` (a new network namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b"\0" * 14))


def held_bytes() -> int:
    """What the job keeps in memory outside its processes' address spaces and outside its
    ``segments``, as seen from its supervisor (which is in its mount and IPC namespaces): the
    bytes used in its tmpfs (``SCRATCH``, ``SHARED_MEMORY`` — files there are memory, deleted
    ones still open too) and the kernel memory of its System V message queues and semaphore
    sets (``ipc_kernel_bytes``)."""
    total = 0
    for folder in (SCRATCH, SHARED_MEMORY):
        try:
            info = os.statvfs(folder)
        except OSError:
            continue
        total += (info.f_blocks - info.f_bfree) * info.f_frsize
    return total + ipc_kernel_bytes()


# What the kernel allocates (x86-64): a semaphore is a cache line (struct sem), a set one
# allocation, rounded up to a power of two pages when larger than one (a set of 32000 takes
# 2 MB, as measured on 6.x kernels); a message a header of 48 bytes in an allocation of at
# least 64, its text in allocations at most twice its size (high); a set or a queue a few
# hundred bytes of its own (high).
SEMAPHORE_BYTES, MESSAGE_BYTES, IPC_OBJECT_BYTES = 64, 64, 1024


def ipc_kernel_bytes(sysvipc: str = "/proc/sysvipc") -> int:
    """The kernel memory the System V message queues and semaphore sets of this IPC
    namespace take (no process's memory shows it), estimated: ``IPC_OBJECT_BYTES`` each, with
    ``MESSAGE_BYTES`` and twice the text of each message queued, and ``SEMAPHORE_BYTES`` per
    semaphore, a set above a page rounded up to a power of two pages (the allocator's)."""
    total = 0
    for row in _rows(f"{sysvipc}/msg"):
        try:
            total += IPC_OBJECT_BYTES + MESSAGE_BYTES * int(row["qnum"]) + 2 * int(row["cbytes"])
        except (KeyError, ValueError):
            continue
    for row in _rows(f"{sysvipc}/sem"):
        try:
            size = IPC_OBJECT_BYTES + SEMAPHORE_BYTES * int(row["nsems"])
        except (KeyError, ValueError):
            continue
        total += size if size <= 4096 else 1 << (size - 1).bit_length()
    return total


def segments(sysvipc: str = "/proc/sysvipc") -> dict[tuple[str, int], int]:
    """The System V shared memory segments of this IPC namespace, ``("sysv", shmid)`` → their
    resident bytes: memory the job keeps under an id, attached or not (``zygote.JobWatch``
    counts the part a process of the job maps in that process's proportional set size, and
    the rest here; a process maps a segment as ``/SYSV…`` with the shmid as its inode)."""
    found = {}
    for row in _rows(f"{sysvipc}/shm"):
        try:
            found[("sysv", int(row["shmid"]))] = int(row["rss"])
        except (KeyError, ValueError):
            continue
    return found


def _rows(path: str) -> list[dict[str, str]]:
    """The rows of a ``/proc/sysvipc`` table, by column name (none when it cannot be read)."""
    try:
        with open(path) as handle:
            header = handle.readline().split()
            return [dict(zip(header, line.split())) for line in handle]
    except OSError:
        return []
