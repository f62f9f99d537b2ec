"""Landlock: a file-system (and TCP) allow list a process puts on itself, with no privilege
and no namespace — the confined rung's wall (``confine.confine_in_place``).

``abi()`` asks the kernel which Landlock ABI it offers (0: none, or refused, e.g. by an old
container profile). ``restrict(rules, tcp=...)`` then makes a ruleset that handles every
file-system right the ABI knows, allows each ``Rule`` (a path and what may be done beneath
it), and restricts the calling thread — and so everything it later starts — to it:

- ABI 1: reading, writing, executing, listing, creating and removing files and folders
  beneath the allowed paths only; ABI 2 adds linking and renaming across folders (REFER),
  ABI 3 truncation, ABI 5 device ``ioctl``s;
- ABI 4: TCP ``bind``/``connect`` refused altogether unless ``tcp``;
- ABI 6: no abstract UNIX socket and no signal reaches a process outside the domain.

What an older ABI cannot handle stays allowed; ``missing(abi)`` says what, in words, for
``doctor``. Landlock restricts access through paths, not metadata (``chmod``, ``chown``,
``utime`` of a path it may not open still work: the seccomp filter and the job's own uid
stand there) and not ``/proc`` contents beyond what the path rules grant. x86-64 only.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from dataclasses import dataclass

from moco_ref.sandbox.clib import c_library, check_call

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # x86-64
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
              5: (1 << 16) - 1}
FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # rights a file can hold

READ = READ_FILE | READ_DIR | EXECUTE
WRITE = (READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK
         | MAKE_FIFO | MAKE_SYM | REFER | TRUNCATE)
DEVICE = READ_FILE | WRITE_FILE  # /dev/null and its kind: read and write, nothing else


@dataclass(frozen=True)
class Rule:
    path: str
    access: int  # READ, WRITE or DEVICE (cut to what the ABI and the path's kind allow)


def abi() -> int:
    """The Landlock ABI this kernel offers this process; 0 when there is none (not built in,
    disabled at boot, refused by a seccomp profile, or not x86-64)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return 0
    version = c_library().syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                                  ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, int(version))


def missing(version: int) -> list[str]:
    """What this ABI's domain does not hold back, in words (empty from ABI 6 on)."""
    if version <= 0:
        return ["no Landlock at all"]
    gaps = []
    if version < 4:
        gaps.append("TCP sockets (Landlock ABI < 4)")
    if version < 6:
        gaps.append("signals and abstract UNIX sockets to processes outside the job "
                    "(Landlock ABI < 6)")
    return gaps


def _fs_rights(version: int) -> int:
    return _FS_BY_ABI.get(version, _FS_BY_ABI[5])


def restrict(rules: list[Rule], *, tcp: bool) -> int:
    """Restrict this thread (and what it starts) to ``rules``; TCP too unless ``tcp``.
    Returns the ABI used; raises ``OSError`` when Landlock is absent or refuses. The caller
    must be single-threaded, with ``no_new_privs`` set (or ``CAP_SYS_ADMIN``)."""
    version = abi()
    if version <= 0:
        raise OSError(38, "Landlock is not available here")
    handled_fs = _fs_rights(version)
    handled_net = 0 if tcp or version < 4 else NET_BIND_TCP | NET_CONNECT_TCP
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 else 0
    if version >= 6:
        attr = struct.pack("QQQ", handled_fs, handled_net, scoped)
    elif version >= 4:
        attr = struct.pack("QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("Q", handled_fs)
    libc = c_library()
    buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(SYS_CREATE_RULESET, buffer, ctypes.c_size_t(len(attr)),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        check_call(-1, "landlock_create_ruleset")
    try:
        for rule in rules:
            _add(libc, ruleset, rule, handled_fs)
        check_call(libc.syscall(SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)),
                   "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return version


def _add(libc, ruleset: int, rule: Rule, handled_fs: int) -> None:
    """One path-beneath rule; a path that does not exist is skipped."""
    try:
        fd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        access = rule.access & handled_fs
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            access &= FILE_ONLY
        if not access:
            return
        attr = struct.pack("=Qi", access, fd)  # struct landlock_path_beneath_attr (packed)
        buffer = ctypes.create_string_buffer(attr, len(attr))
        check_call(libc.syscall(SYS_ADD_RULE, ruleset, ctypes.c_int(RULE_PATH_BENEATH),
                                buffer, ctypes.c_uint32(0)),
                   f"landlock_add_rule {rule.path}")
    finally:
        os.close(fd)
