"""Start bwrap as an unprivileged host user when the grader is root:

    python -I -S launch.py PLAN -- bwrap …

(run by path, with no site and no moco_ref import: the grader runs it before any sandbox
exists). ``PLAN`` is JSON ``{"uid": U, "gid": G, "cover": [...], "reveal": [...]}``, made by
``bwrap.launch_command``. As root, the launcher

1. when ``cover`` is not empty: takes a private mount namespace of its own (nothing it does
   there is seen by the host or the grader) and, for each folder of ``cover`` — a folder the
   uid may not pass, such as root's home holding the Python installation — mounts an empty
   ``tmpfs`` over it and binds back only the paths of ``reveal`` below it (what bwrap binds
   into the sandbox), at their own places: bwrap, now unprivileged, can reach them, and
   nothing else of the covered folder;
2. drops to ``uid``/``gid`` with no supplementary groups (``setgroups``, ``setresgid``,
   ``setresuid``) and checks that no way back to root is left;
3. execs bwrap, which then makes its user namespace as that uid: uid 0 of the sandbox is
   ``uid`` on the host, with no power over the host's files (``/dev/null`` and the other
   device nodes bwrap binds are root's, so they cannot be changed) and with the kernel's
   per-user limits (``RLIMIT_NPROC``) in force, which it does not enforce for root.

Any refusal exits with status 126 and one line on stderr, which the grader shows.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 1 << 18


def _fail(message: str) -> None:
    os.write(2, f"moco-ref launcher: {message}\n".encode())
    os._exit(126)


def _call(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        _fail(f"{what}: {os.strerror(number)}")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _covered_between(path: str, folder: str, cover: list[str]) -> bool:
    """Whether a covered folder lies at or below ``folder`` and above ``path``: binding
    ``folder`` (recursively, after the covers) brings that cover along, so ``path`` must be
    bound again on top of it."""
    return any(_inside(covered, folder) and _inside(path, covered) and path != covered
               for covered in cover)


def cover_and_reveal(cover: list[str], reveal: list[str]) -> None:
    """Step 1 above."""
    libc = ctypes.CDLL(None, use_errno=True)
    _call(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _call(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    held = []  # every revealed path, opened before anything covers it
    for path in sorted(set(reveal), key=len):
        if any(_inside(path, done) and not _covered_between(path, done, cover)
               for done, _, _ in held):
            continue  # bound with a folder above it
        held.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC), os.path.isdir(path)))
    for folder in sorted(set(cover), key=len):
        if any(_inside(folder, other) and folder != other for other in cover):
            continue  # inside another covered folder
        _call(libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                         b"mode=0755,size=1m"), f"cover {folder}")
    os.umask(0o022)
    for path, fd, is_dir in held:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if is_dir:
            os.makedirs(path, exist_ok=True)
        elif not os.path.exists(path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        _call(libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None,
                         MS_BIND | MS_REC, None), f"reveal {path}")
        os.close(fd)


def become(uid: int, gid: int) -> None:
    """Step 2 above."""
    if uid == 0 or gid == 0:
        _fail("refusing to run the sandbox as root")
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as error:
        _fail(f"cannot become uid {uid}: {error.strerror}")
    if set(os.getresuid()) != {uid} or set(os.getresgid()) != {gid} or os.getgroups():
        _fail(f"still not only uid {uid}")
    try:
        os.setresuid(0, 0, 0)
    except OSError:
        return
    _fail("uid 0 could be taken back")


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        _fail("usage: launch.py PLAN -- COMMAND …")
    plan = json.loads(argv[0])
    if plan.get("cover"):
        cover_and_reveal(plan["cover"], plan.get("reveal", []))
    become(int(plan["uid"]), int(plan["gid"]))
    os.chdir("/")
    try:
        os.execv(argv[2], argv[2:])
    except OSError as error:
        _fail(f"cannot run {argv[2]}: {error.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
