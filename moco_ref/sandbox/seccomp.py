"""A seccomp filter for a graded submission's process, built here as a classic BPF program
(no libseccomp needed) and installed with ``prctl(PR_SET_SECCOMP)`` after
``no_new_privs``. It is inherited by every thread and child and cannot be removed.

The filter is a deny list of calls no grading ever needs, each refused with ``EPERM``:

- other processes' memory and execution: ``ptrace``, ``process_vm_readv``/``writev``,
  ``kcmp``, ``pidfd_getfd``;
- the file system's shape: ``mount``, ``umount2``, ``pivot_root``, ``chroot``, the new mount
  API (``open_tree``, ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``,
  ``mount_setattr``), ``name_to_handle_at``/``open_by_handle_at``;
- new namespaces: ``unshare``, ``setns``, and ``clone`` with any ``CLONE_NEW*`` flag;
  ``clone3`` answers ``ENOSYS`` (its flags sit in memory a filter cannot read; libc then
  falls back to ``clone``, which the filter can judge);
- kernel attack surface: ``keyctl``, ``add_key``, ``request_key``, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, ``io_uring_setup``/``enter``/``register``;
- the machine: ``kexec_load``, ``kexec_file_load``, ``init_module``, ``finit_module``,
  ``delete_module``, ``reboot``, ``swapon``, ``swapoff``, ``acct``, ``syslog``,
  ``settimeofday``, ``clock_settime``, ``clock_adjtime``, ``adjtimex``, ``quotactl``;
- ``personality`` (e.g. turning address-space randomisation off) and ``ioctl(TIOCSTI)``
  (typing into a terminal).

Calls from another ABI (x32, i386 on x86-64) kill the process: the numbers above would not
mean the same calls. Only x86-64 has a table here; elsewhere ``available()`` says why not.

The confined rung (no namespaces: ``confine.confine_in_place``) adds ``Tightening``: sockets
of no family but UNIX (and, for a job that needs loopback TCP, IPv4/IPv6), since the job
shares the container's network; ``prctl(PR_SET_DUMPABLE)``, so the job cannot hide its
processes from its supervisor's watch; System V IPC (shared memory segments, message queues,
semaphore sets) and POSIX message queues (``IPC_X86_64``), since the job shares the
container's IPC namespace, where what it made would outlive it and no job's memory would
count it (nothing a MoCo submission needs uses them: torch shares tensors through
``/dev/shm`` files and memory files, multiprocessing's semaphores are ``/dev/shm`` files,
which the job's watch counts and its end removes: ``shared_memory``); and, for a job that is
still uid 0 (without capabilities), every call that changes a file's mode, owner, times or
extended attributes, which Landlock does not govern and root owns the files for.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

from moco_ref.sandbox.clib import c_library, check_call

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0_LOW, _ARG1_LOW = 0, 4, 16, 24

BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_JSET_K = 0x45
BPF_RET_K = 0x06

CLONE_NEW_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
                   | 0x20000000 | 0x40000000)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
#                                                NEWPID, NEWNET
TIOCSTI = 0x5412

REFUSED_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "pidfd_getfd": 438,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "unshare": 272, "setns": 308,
    "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
    "syslog": 103, "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305,
    "adjtimex": 159, "quotactl": 179, "personality": 135,
    "sched_setaffinity": 203,  # a job keeps the CPU share it was given (attempt.CpuShares)
}
CLONE_X86_64, CLONE3_X86_64, IOCTL_X86_64 = 56, 435, 16
SOCKET_X86_64, PRCTL_X86_64 = 41, 157
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
PR_SET_DUMPABLE = 4
# System V IPC and POSIX message queues: the confined rung's IPC namespace is the container's
IPC_X86_64 = {
    "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65,
    "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
    "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
    "mq_notify": 244, "mq_getsetattr": 245,
}
FILE_METADATA_X86_64 = {
    "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93,
    "lchown": 94, "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261,
    "utimensat": 280, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190,
    "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
}


@dataclass(frozen=True)
class Tightening:
    """What the confined rung refuses on top of the common list (see the module's text)."""

    tcp: bool = False  # IPv4/IPv6 (and netlink, to list interfaces) sockets allowed
    file_metadata: bool = False  # refuse FILE_METADATA_X86_64 (a job still uid 0)

    def refused(self) -> list[str]:
        found = ["socket (families but UNIX" + (", IPv4, IPv6, netlink)" if self.tcp else ")"),
                 "prctl (PR_SET_DUMPABLE)", *sorted(IPC_X86_64)]
        return found + (sorted(FILE_METADATA_X86_64) if self.file_metadata else [])


def available() -> str:
    """"" when a filter can be built and installed here, else why not."""
    if not hasattr(os, "fork") or platform.system() != "Linux":
        return "seccomp is Linux only"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"no system-call table for {platform.machine()} (only x86-64)"
    return ""


def refused_calls(tightening: Tightening | None = None) -> list[str]:
    """The names of the calls the filter refuses, for the documentation and ``doctor``."""
    extra = tightening.refused() if tightening else []
    return sorted([*REFUSED_X86_64, "clone (CLONE_NEW* flags)", "clone3 (ENOSYS)",
                   "ioctl (TIOCSTI)", *extra])


def _statement(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def program(tightening: Tightening | None = None) -> bytes:
    """The filter, as ``struct sock_filter`` entries."""
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    code = [
        _statement(BPF_LD_W_ABS, _ARCH),
        _statement(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        _statement(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        _statement(BPF_LD_W_ABS, _NR),
        _statement(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        _statement(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
    ]
    refused = dict(REFUSED_X86_64)
    if tightening:
        refused.update(IPC_X86_64)
    if tightening and tightening.file_metadata:
        refused.update(FILE_METADATA_X86_64)
    code += refusing(refused.values(), deny)
    if tightening:
        code += _tightened(tightening, deny)
    code += namespace_clones(deny)
    # ioctl(fd, TIOCSTI, …)
    code += [_statement(BPF_JEQ_K, IOCTL_X86_64, 0, 4),
             _statement(BPF_LD_W_ABS, _ARG1_LOW),
             _statement(BPF_JEQ_K, TIOCSTI, 0, 1),
             _statement(BPF_RET_K, deny),
             _statement(BPF_RET_K, SECCOMP_RET_ALLOW)]
    code += allow_the_rest()
    return b"".join(code)


def load_call_number() -> list[bytes]:
    """The statement that loads the call's number (what ``refusing`` compares)."""
    return [_statement(BPF_LD_W_ABS, _NR)]


def refusing(numbers, deny: int) -> list[bytes]:
    """Each call of ``numbers`` answered ``deny``, the call's number loaded."""
    code = []
    for number in sorted(numbers):
        code += [_statement(BPF_JEQ_K, number, 0, 1), _statement(BPF_RET_K, deny)]
    return code


def namespace_clones(deny: int) -> list[bytes]:
    """``clone3`` answered ``ENOSYS`` (its flags sit in memory a filter cannot read; libc then
    falls back to ``clone``) and ``clone`` with any ``CLONE_NEW*`` flag answered ``deny``
    (the low 32 bits of its first argument hold them all), the call's number loaded."""
    return [_statement(BPF_JEQ_K, CLONE3_X86_64, 0, 1),
            _statement(BPF_RET_K, SECCOMP_RET_ERRNO | errno.ENOSYS),
            _statement(BPF_JEQ_K, CLONE_X86_64, 0, 4),
            _statement(BPF_LD_W_ABS, _ARG0_LOW),
            _statement(BPF_JSET_K, CLONE_NEW_FLAGS, 0, 1),
            _statement(BPF_RET_K, deny),
            _statement(BPF_RET_K, SECCOMP_RET_ALLOW)]


def allow_the_rest() -> list[bytes]:
    return [_statement(BPF_RET_K, SECCOMP_RET_ALLOW)]


def _tightened(tightening: Tightening, deny: int) -> list[bytes]:
    """socket(family, …) and prctl(PR_SET_DUMPABLE, …), with the call's number loaded."""
    families = [AF_UNIX] + ([AF_INET, AF_INET6, AF_NETLINK] if tightening.tcp else [])
    code = [_statement(BPF_JEQ_K, SOCKET_X86_64, 0, 2 + 2 * len(families)),
            _statement(BPF_LD_W_ABS, _ARG0_LOW)]
    for family in families:
        code += [_statement(BPF_JEQ_K, family, 0, 1),
                 _statement(BPF_RET_K, SECCOMP_RET_ALLOW)]
    code.append(_statement(BPF_RET_K, deny))
    code += [_statement(BPF_JEQ_K, PRCTL_X86_64, 0, 4),
             _statement(BPF_LD_W_ABS, _ARG0_LOW),
             _statement(BPF_JEQ_K, PR_SET_DUMPABLE, 0, 1),
             _statement(BPF_RET_K, deny),
             _statement(BPF_RET_K, SECCOMP_RET_ALLOW)]
    return code


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(tightening: Tightening | None = None) -> None:
    """``no_new_privs``, then the filter, for this process and everything it starts.
    Raises ``OSError`` when the kernel refuses."""
    reason = available()
    if reason:
        raise OSError(errno.ENOSYS, reason)
    check_call(c_library().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    load(program(tightening))


def load(code: bytes) -> None:
    """Install the filter ``code`` for this process and everything it starts (the caller has
    ``no_new_privs`` or ``CAP_SYS_ADMIN``). Raises ``OSError`` when the kernel refuses."""
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    check_call(c_library().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog),
                                 0, 0), "seccomp")
