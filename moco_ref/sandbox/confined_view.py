"""What a confined-rung job may see (the grader's side of ``confine.confine_in_place``).

``copy_view`` copies the observing side of moco_ref (``bwrap.VIEW_FILES``, plus the
reference with ``--allow-reference-import``) into a folder of the zygote's: the only moco_ref
the confined zygote imports, so an installed or checked-out moco_ref — the judge, the
rubric's code — is never a path a job may read. ``rules`` lists what every job may use, as
``[path, landlock access]``: read-only the system folders, the Python installation and its
site-packages (split around an installed moco_ref and the grader's own folders), the view,
the few ``/etc`` files the loader and the C library read, ``/proc`` and the CPU topology;
read-write the harmless device nodes and ``/dev/shm``. Each job adds its own scratch
(read-write); nothing else of the container is reachable, whatever its permissions.
"""

from __future__ import annotations

import os
import shutil

from moco_ref.sandbox import bwrap, landlock

ETC_READ = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group",
            "hosts", "nsswitch.conf", "host.conf", "gai.conf")
OTHER_READ = ("/proc", "/sys")  # read-only: the CPU topology, and gloo scans devices
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
SHARED_MEMORY = "/dev/shm"


def copy_view(view: str, *, reference: bool = False) -> None:
    """The observing side of moco_ref, readable by all, under ``view/moco_ref``."""
    for relative in bwrap.VIEW_FILES + (("core",) if reference else ()):
        source = bwrap.PACKAGE_DIR / relative
        if not source.exists():
            continue
        target = os.path.join(view, "moco_ref", relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    for folder, _folders, files in os.walk(view):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


def system_folders() -> list[str]:
    """The system folders every job reads (``/usr``, ``/lib``…), resolved."""
    return list(dict.fromkeys(os.path.realpath(f"/{top}") for top in bwrap.SYSTEM_TOP))


def split_around(root: str, hidden: list[str]) -> list[str]:
    """``root``, or, when a hidden path lies strictly inside it, its entries but the hidden
    ones (an entry holding a hidden path is split the same way): the paths to grant so that
    nothing hidden is beneath any of them."""
    if root in hidden:
        return []
    inside = [path for path in hidden if _inside(path, root)]
    if not inside:
        return [root]
    granted = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    for name in names:
        entry = os.path.join(root, name)
        if entry in hidden:
            continue
        granted += split_around(entry, hidden) if any(
            _inside(path, entry) for path in inside) else [entry]
    return granted


def rules(view: str, *, hidden: tuple[str, ...]) -> list[list]:
    """What every confined job may use (see the module's text)."""
    hidden_real = sorted({os.path.realpath(path) for path in hidden})
    installed = [os.path.join(folder, "moco_ref") for folder in bwrap.python_folders()]
    hidden_real += [path for path in installed if os.path.isdir(path)]
    hidden_real.append(os.path.realpath(bwrap.grader_root()))
    covered: list[str] = []
    read: list[str] = []
    # each folder split around what is hidden in it: a moco_ref installed under /usr (a
    # container's pip) lies inside a system folder granted otherwise whole
    tops = [path for path in system_folders() if os.path.isdir(path)]
    for folder in [*tops, *bwrap.python_folders(), *bwrap.code_folders()]:
        if not any(_inside(folder, done) for done in covered):
            read += split_around(folder, hidden_real)
            covered.append(folder)
    read += [f"/etc/{name}" for name in ETC_READ if os.path.exists(f"/etc/{name}")]
    read += [path for path in OTHER_READ if os.path.exists(path)]
    read.append(view)
    granted = [[path, landlock.READ] for path in read]
    granted += [[path, landlock.DEVICE] for path in DEVICES if os.path.exists(path)]
    if os.path.isdir(SHARED_MEMORY):
        granted.append([SHARED_MEMORY, landlock.WRITE])
    return granted


def readable_by_others(paths: list[str]) -> bool:
    """Whether a job uid (no account, no group) may read every path of ``paths`` and pass
    every folder above it: then jobs can run as their own uids."""
    uid = gid = bwrap.HOST_IDS.start
    for path in paths:
        if not os.path.exists(path):
            continue
        if bwrap.first_closed_folder(path, uid, gid) is not None:
            return False
        wanted = 0o5 if os.path.isdir(path) else 0o4
        if not bwrap.allows(os.stat(path), uid, gid, wanted):
            return False
    return True


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
