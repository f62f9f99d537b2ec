"""Run a command the way Docker's default profile runs a container's process, to try the
grader where Gradescope and PrairieLearn run it:

    python -m moco_ref.tools.default_container [--home-closed] -- COMMAND ...

As root (with every capability, on this machine), in a mount namespace of its own:

1. unless ``--home-closed``: the folders above the Python installation that other users may
   not pass (root's home, here) are covered by an empty tmpfs that holds only the Python
   installation again (and the grader's own checkout and working folder, when a covered
   folder holds them), as in an image whose Python lives in ``/usr`` — the confined rung can
   then run each job as a uid of its own; with ``--home-closed`` the installation stays
   unreachable to other users, and jobs run as uid 0 without capabilities;
2. a seccomp filter refusing what Docker's default profile refuses to an unprivileged
   container: ``unshare``, ``setns``, ``mount``, ``umount2``, ``pivot_root``, the new mount
   API, ``clone`` with any ``CLONE_NEW*`` flag (``EPERM``), and ``clone3`` (``ENOSYS``, so the
   C library falls back to ``clone``);
3. the capability sets cut to Docker's default set (no ``CAP_SYS_ADMIN``, no
   ``CAP_SYS_PTRACE``, …) in the bounding, permitted, effective and inheritable sets;
4. ``exec`` of the command, which keeps uid 0.

It exists for tests and for ``prairielearn test --default-container``; it is not a sandbox.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import struct
import sys

from moco_ref.sandbox import bwrap
from moco_ref.sandbox import seccomp as filters
from moco_ref.sandbox.clib import c_library, check_call

DOCKER_CAPABILITIES = {  # Docker's default capability set, by number
    "CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
    "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18,
    "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31,
}
REFUSED = {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
           "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
           "fsmount": 432, "fspick": 433, "mount_setattr": 442}
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4


def docker_filter() -> bytes:
    """The seccomp program of step 2, as ``struct sock_filter`` entries."""
    deny = filters.SECCOMP_RET_ERRNO | errno.EPERM
    return b"".join(filters.load_call_number() + filters.refusing(REFUSED.values(), deny)
                    + filters.namespace_clones(deny) + filters.allow_the_rest())


def _open_python_installation() -> None:
    """Step 1: cover each closed folder above the Python folders, and bind them back."""
    uid = gid = bwrap.HOST_IDS.start
    folders = bwrap.python_folders()
    covers = {bwrap.first_closed_folder(folder, uid, gid) for folder in folders} - {None}
    if not covers:
        return
    # the grader's own checkout and working folder stay where they are (a covered folder may
    # hold them too, e.g. a checkout in a private temporary folder)
    # (their entries, not the folders: a covered folder itself stays passable)
    grader = sorted({os.path.join(folder, name)
                     for folder in {str(bwrap.PACKAGE_DIR.parent), os.getcwd()}
                     for name in os.listdir(folder)})
    plan = {"uid": 0, "gid": 0, "cover": sorted(covers), "reveal": folders + grader}
    from importlib import util

    spec = util.spec_from_file_location("moco_ref_launch", bwrap.LAUNCHER)
    launch = util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    launch.cover_and_reveal(plan["cover"], plan["reveal"])


def _limit_capabilities() -> None:
    """Step 3."""
    libc = c_library()
    keep = set(DOCKER_CAPABILITIES.values())
    for number in range(64):
        if number not in keep and libc.prctl(PR_CAPBSET_DROP, number, 0, 0, 0) != 0:
            break
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    mask = sum(1 << number for number in keep)
    header = struct.pack("Ii", 0x20080522, 0)
    data = struct.pack("IIIIII", mask, mask, mask, 0, 0, 0)  # effective, permitted, inheritable
    header_buffer = ctypes.create_string_buffer(header, len(header))
    data_buffer = ctypes.create_string_buffer(data, len(data))
    check_call(libc.syscall(126, header_buffer, data_buffer), "capset")


def enter(*, home_closed: bool = False) -> None:
    """Steps 1-3 for this process (root, single-threaded)."""
    if os.geteuid() != 0:
        raise OSError(errno.EPERM, "the default-container simulation must start as root")
    libc = c_library()
    check_call(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    check_call(libc.mount(b"none", b"/", None, 0x4000 | (1 << 18), None), "make / private")
    if not home_closed:
        _open_python_installation()
    filters.load(docker_filter())  # as root with CAP_SYS_ADMIN: no no_new_privs needed
    _limit_capabilities()


def command(argv: list[str], *, home_closed: bool = False) -> list[str]:
    """The command line that runs ``argv`` inside the simulation (for ``subprocess``)."""
    flags = ["--home-closed"] if home_closed else []
    return [sys.executable, "-m", "moco_ref.tools.default_container", *flags, "--", *argv]


def status() -> dict:
    """What the process sees of its confinement (for tests): capabilities and seccomp."""
    fields = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("CapEff", "CapBnd", "CapPrm", "Seccomp", "NoNewPrivs"):
                fields[key] = value.strip()
    return fields


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moco_ref.tools.default_container")
    parser.add_argument("--home-closed", action="store_true",
                        help="leave the Python installation unreachable to other users")
    parser.add_argument("--status", action="store_true", help="print status() and exit")
    parser.add_argument("command", nargs="*")
    args = parser.parse_args(argv)
    try:
        enter(home_closed=args.home_closed)
    except OSError as exc:
        print(f"moco-ref default container: {exc}", file=sys.stderr)
        return 2
    if args.status or not args.command:
        print(json.dumps(status()))
        return 0
    try:
        os.execvp(args.command[0], args.command)
    except OSError as exc:
        print(f"moco-ref default container: cannot run {args.command[0]}: {exc.strerror}",
              file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
