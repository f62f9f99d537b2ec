"""Finding and killing every process a graded submission started, by scanning ``/proc``.

A submission may start processes that try to outlive it: a plain child, one in a new session
(``setsid``), a double fork whose middle process exits (the grandchild is re-parented), one
exec'd with a cleared environment. The grader marks and follows them in layers, and kills
whatever any layer finds (see ``job_members``):

- **ancestry**: descendants of the job's supervisor, found by following parent pids. The
  supervisor is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so an orphaned grandchild
  is re-parented to it, not to init, and stays in its tree;
- **session**: processes in the supervisor's session (a submission must call ``setsid`` to
  leave it);
- **environment token**: ``MOCO_REF_GRADE_JOB=<random hex>`` is set in the submission's
  environment, so every program it execs inherits it (unless it clears its environment).

In the bwrap sandbox, none of this is needed for safety — each job has its own PID namespace,
which the kernel empties when its init ends — but the same sweep runs as a second line.

Only Linux has ``/proc``; elsewhere the scans find nothing and only the process-group kill of
the supervisor remains.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

PROC = "/proc"
TOKEN_VARIABLE = "MOCO_REF_GRADE_JOB"
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str  # "R", "S", "Z" (zombie), …
    start: int  # clock ticks after boot: (pid, start) names a process even if pids are reused
    cpu_ticks: int = 0  # user + system time, its own and its reaped children's
    threads: int = 1  # its threads (tasks), itself included

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X", "x")


def proc_available() -> bool:
    return os.path.isdir(os.path.join(PROC, "self"))


def read_info(pid: int) -> ProcessInfo | None:
    """``/proc/PID/stat`` parsed, or None when the process is gone (or not readable)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("ascii", errors="replace")
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session …": comm may hold spaces and parentheses.
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return ProcessInfo(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0],
                           int(fields[19]), sum(int(value) for value in fields[11:15]),
                           int(fields[17]))
    except (IndexError, ValueError):
        return None


def all_processes() -> dict[int, ProcessInfo]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.isdigit():
            info = read_info(int(name))
            if info is not None:
                found[info.pid] = info
    return found


def environ_has(pid: int, entry: bytes) -> bool:
    """Whether ``entry`` (``b"NAME=value"``) is in the environment PID was exec'd with."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as handle:
            return entry in handle.read().split(b"\0")
    except OSError:
        return False


def cmdline_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as handle:
            return needle in handle.read()
    except OSError:
        return False


def descendants(roots: Iterable[int], table: dict[int, ProcessInfo] | None = None) -> set[int]:
    """Every process below ``roots`` in the parent tree (the roots excluded)."""
    table = all_processes() if table is None else table
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def token_entry(token: str) -> bytes:
    return f"{TOKEN_VARIABLE}={token}".encode()


def job_members(
    *,
    roots: Iterable[int] = (),
    sessions: Iterable[int] = (),
    token: str | None = None,
    exclude: Iterable[int] = (),
) -> set[int]:
    """Live processes that belong to a job: below ``roots``, in one of ``sessions``, or
    carrying the job's environment ``token``. ``exclude`` (and this process) never are."""
    table = all_processes()
    roots, sessions = set(roots), set(sessions)
    members = descendants(roots, table)
    entry = token_entry(token) if token else None
    for info in table.values():
        # A session's leader is left out: the job's leader is found as a root, and a new
        # process that reused a dead leader's pid for a session of its own is not the job's.
        in_session = info.sid in sessions and info.pid != info.sid
        if in_session or (entry is not None and environ_has(info.pid, entry)):
            members.add(info.pid)
    members -= set(exclude) | {os.getpid()}
    return {pid for pid in members if pid in table and table[pid].alive}


def real_uid(pid: int) -> int | None:
    """The real uid of ``pid`` (``/proc/PID/status``, readable whoever it belongs to), or
    None when it cannot be read."""
    try:
        with open(os.path.join(PROC, str(pid), "status"), "rb") as handle:
            for line in handle:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def processes_of_user(uid: int) -> set[int]:
    """Live processes whose real uid is ``uid`` (the confined rung's job uid is its own)."""
    return {int(name) for name in os.listdir(PROC)
            if name.isdigit() and real_uid(int(name)) == uid and alive(int(name))}


def kill_until_gone(
    find: Callable[[], set[int]], *, deadline_seconds: float = 10.0, pause: float = 0.02
) -> int:
    """SIGKILL what ``find()`` returns, again and again, until it returns nothing (a process
    may fork between a scan and the kill; a killed one cannot). Returns how many distinct
    processes were signalled."""
    signalled: set[int] = set()
    deadline = time.monotonic() + deadline_seconds
    while True:
        targets = find()
        if not targets or time.monotonic() > deadline:
            return len(signalled)
        for pid in targets:
            try:
                os.kill(pid, signal.SIGSTOP)  # frozen first: no more forks while we sweep
            except (ProcessLookupError, PermissionError):
                pass
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
                signalled.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(pause)


def reap_children() -> None:
    """Collect every exited child of this process (zombies), without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` through libc; False where it is not available."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def alive(pid: int) -> bool:
    info = read_info(pid)
    return info is not None and info.alive


def host_identity(root: int) -> tuple[list[int], str] | None:
    """``([real, effective, saved, file system uid], uid_map)`` of the first process at or
    below ``root`` that lives in a user namespace other than this process's — e.g. bwrap's
    sandbox below the bwrap process — as seen from here; None when there is none."""
    try:
        ours = os.readlink(f"{PROC}/self/ns/user")
    except OSError:
        return None
    for pid in [root, *sorted(descendants([root]))]:
        try:
            if os.readlink(f"{PROC}/{pid}/ns/user") == ours:
                continue
            with open(f"{PROC}/{pid}/status") as handle:
                uids = next(line for line in handle if line.startswith("Uid:"))
            with open(f"{PROC}/{pid}/uid_map") as handle:
                mapping = "; ".join(" ".join(line.split()) for line in handle if line.strip())
        except (OSError, StopIteration):
            continue
        return [int(field) for field in uids.split()[1:]], mapping
    return None
