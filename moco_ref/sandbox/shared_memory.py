"""A confined job's ``/dev/shm``: the memory of the container every job may write under a
name — POSIX shared memory (``shm_open``, torch's ``file_system`` sharing,
``multiprocessing.shared_memory``) and named semaphores (``sem_open``'s ``sem.NAME``
files, multiprocessing's locks) — where what a job leaves outlives it and no process's
memory counts it.

The confined rung has no mount namespace, so ``/dev/shm`` is the container's and every job
shares it (the bwrap rung gives each job a small tmpfs of its own instead: ``jobspace``).
The job's supervisor counts the job's entries there against its memory (``zygote.JobWatch``:
each file once, by the bytes allocated to it) and removes them when the job ends, however it
ends — by itself, at a limit, at its deadline or killed; when the supervisor itself was
killed, the zygote removes them as it collects it. Which entries are the job's (``Owner``):

- a job with a uid of its own (the grader is root): the entries that uid owns, anywhere
  below ``/dev/shm``;
- a job that stays uid 0 (the grader is root but its Python installation is closed to other
  users): it runs with a gid of its own, which every file it makes carries (the filter
  refuses it ``chown``, and it cannot make a folder that would give its files another group),
  so the entries of that gid;
- a job of the grader's own uid (the grader is not root, and cannot give it another): the
  entries of that uid that were not there, with the same inode and name, when the job
  started. Two such jobs running at once cannot be told apart: an entry one of them makes
  while the other runs counts against both, and the end of either removes it unless a live
  process still holds it open or mapped (what multiprocessing and torch keep there while
  they use it). A file made before the job started and grown by it counts against no job.

A file the job has unlinked but still holds open or mapped is no entry: its watch counts it
through the job's descriptors and mappings (``JobWatch.memory_files``). The walk sees the
first ``MAX_ENTRIES`` entries of ``/dev/shm``; a job that keeps more than ``MAX_JOB_ENTRIES``
there (each costs the kernel memory that no byte count shows) is over its limits, as is one
that makes a folder there its supervisor cannot list.

Imported by the zygote inside the confined view: nothing of the grader's side.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

SHARED_MEMORY = "/dev/shm"
MAX_ENTRIES = 20000  # entries of /dev/shm walked per look
MAX_JOB_ENTRIES = 4096  # files and folders one job may keep there


@dataclass(frozen=True)
class Owner:
    """Which entries of ``/dev/shm`` are one job's (see the module's text)."""

    uid: int | None = None
    gid: int | None = None
    before: frozenset | None = None  # (inode, path) there when the job started (the grader's uid)

    @classmethod
    def of_job(cls, confined: dict, root: str = SHARED_MEMORY) -> Owner:
        """The owner of a confined job's entries, from its request's ``confined`` part; for a
        job of the grader's uid, what ``root`` holds now (call it before the job starts)."""
        if confined.get("uid"):
            return cls(uid=int(confined["uid"]))
        if confined.get("gid"):
            return cls(gid=int(confined["gid"]))
        entries, _ = walk(root)
        return cls(uid=os.geteuid(), before=frozenset((info.st_ino, path)
                                                      for path, info in entries))

    @property
    def shared(self) -> bool:
        """Whether the job shares its uid and gid with the grader (told apart by time)."""
        return self.before is not None

    def owns(self, path: str, info: os.stat_result) -> bool:
        if self.gid is not None:
            return info.st_gid == self.gid
        if info.st_uid != self.uid:
            return False
        return self.before is None or (info.st_ino, path) not in self.before


@dataclass
class Holdings:
    """What a job keeps in ``/dev/shm``: ``files`` by ``(st_dev, st_ino)`` (each once) with
    their allocated bytes, how many ``entries``, and its folders that could not be listed."""

    files: dict = field(default_factory=dict)
    entries: int = 0
    unreadable: list = field(default_factory=list)

    def problem(self) -> str:
        """Why the job is over its limits for what it keeps there, or ``""``."""
        if self.unreadable:
            return ("watch: the job made a folder in /dev/shm that its supervisor cannot list "
                    "(what it holds could not be counted)")
        if self.entries > MAX_JOB_ENTRIES:
            return (f"/dev/shm: the job kept more than {MAX_JOB_ENTRIES} files and folders "
                    "in /dev/shm")
        return ""


def walk(root: str, *, limit: int = MAX_ENTRIES, repair: bool = False
         ) -> tuple[list[tuple[str, os.stat_result]], list[tuple[str, os.stat_result]]]:
    """``(path relative to root, lstat)`` of the first ``limit`` entries below ``root`` (a
    folder before what it holds), and the folders that could not be listed. ``repair``: a
    folder that cannot be listed is made ``0700`` first (works for its owner)."""
    found: list = []
    unreadable: list = []
    todo: list = [("", None)]
    while todo and len(found) < limit:
        relative, info = todo.pop()
        folder = os.path.join(root, relative) if relative else root
        try:
            entries = list(os.scandir(folder))
        except OSError:
            entries = None
            if repair and info is not None:
                try:
                    os.chmod(folder, 0o700)
                    entries = list(os.scandir(folder))
                except OSError:
                    entries = None
            if entries is None:
                if info is not None:
                    unreadable.append((relative, info))
                continue
        for entry in entries:
            if len(found) >= limit:
                break
            try:
                entry_info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            path = os.path.join(relative, entry.name) if relative else entry.name
            found.append((path, entry_info))
            if stat.S_ISDIR(entry_info.st_mode):
                todo.append((path, entry_info))
    return found, unreadable


def holdings(owner: Owner, root: str = SHARED_MEMORY) -> Holdings:
    """What ``owner``'s job keeps below ``root`` now."""
    entries, unreadable = walk(root)
    held = Holdings()
    for path, info in entries:
        if owner.owns(path, info):
            held.entries += 1
            if not stat.S_ISDIR(info.st_mode):
                held.files[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    held.unreadable = [path for path, info in unreadable if owner.owns(path, info)]
    return held


def sweep(owner: Owner, root: str = SHARED_MEMORY, *, spare: frozenset = frozenset()) -> int:
    """Remove every entry of ``owner``'s job below ``root`` but those whose ``(st_dev,
    st_ino)`` is in ``spare`` (held by a live process: a neighbour's, for a job of the
    grader's uid), deepest first (a folder holding what is not the job's stays). Returns how
    many were removed. Run it as the entries' owner (or root)."""
    removed = 0
    for _ in range(8):  # again while the walk's limit hid some
        entries, _ = walk(root, repair=True)
        mine = [(path, info) for path, info in entries if owner.owns(path, info)
                and (info.st_dev, info.st_ino) not in spare]
        if not mine:
            break
        done = 0
        for path, info in sorted(mine, key=lambda item: item[0].count("/"), reverse=True):
            try:
                if stat.S_ISDIR(info.st_mode):
                    os.rmdir(os.path.join(root, path))
                else:
                    os.unlink(os.path.join(root, path))
                done += 1
            except OSError:
                pass
        removed += done
        if not done or len(entries) < MAX_ENTRIES:
            break
    return removed


def held_open(uid: int, device: int) -> frozenset:
    """``(st_dev, st_ino)`` of the files on ``device`` that a live process of ``uid`` holds
    open or maps (read from ``/proc``: a process it cannot read holds nothing here)."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            descriptors = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in descriptors:
            try:
                info = os.stat(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if info.st_dev == device:
                found.add((info.st_dev, info.st_ino))
        try:
            with open(f"/proc/{name}/maps", "rb") as handle:
                for line in handle:
                    fields = line.split()
                    if len(fields) < 6:
                        continue
                    major, minor = (int(part, 16) for part in fields[3].split(b":"))
                    if os.makedev(major, minor) == device:
                        found.add((device, int(fields[4])))
        except (OSError, ValueError):
            continue
    return frozenset(found)


def device(root: str = SHARED_MEMORY) -> int | None:
    """``st_dev`` of ``root`` (None when there is none)."""
    try:
        return os.stat(root).st_dev
    except OSError:
        return None
