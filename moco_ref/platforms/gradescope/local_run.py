"""Try a Gradescope autograder zip here, as Gradescope would run it, without ``setup.sh``
(this environment already has moco-ref): unpack it into an ``/autograder``-shaped tree, put
the submission in, run ``run_autograder``, and validate ``results/results.json`` against
Gradescope's format (``moco-ref gradescope test``)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from moco_ref.platforms.course import EXECUTABLE, PYTHON_VARIABLE, PlatformError
from moco_ref.platforms.gradescope.packager import REQUIRED_MEMBERS, ROOT_VARIABLE
from moco_ref.platforms.gradescope.writer import gradescope_problems
from moco_ref.platforms.local_run import TryResult, run_and_validate


def _unpack(zip_path: Path, source: Path) -> None:
    if not zip_path.is_file():
        raise PlatformError(f"no such file: {zip_path}")
    if not zipfile.is_zipfile(zip_path):
        raise PlatformError(f"{zip_path} is not a zip file")
    with zipfile.ZipFile(zip_path) as archive:
        names = archive.namelist()
        missing = [name for name in REQUIRED_MEMBERS if name not in names]
        if missing:
            raise PlatformError(f"{zip_path} has no {missing[0]} at its root (Gradescope "
                                  "needs setup.sh and run_autograder there)")
        for name in names:
            target = (source / name).resolve()
            if not target.is_relative_to(source.resolve()):
                raise PlatformError(f"{zip_path}: member {name!r} would land outside the "
                                      "autograder's source folder")
        archive.extractall(source)


def try_autograder(zip_path, submission, *, keep=None, timeout: float = 900.0) -> TryResult:
    """Unpack ``zip_path`` into an ``/autograder``-shaped tree (``keep``, or a temporary
    folder), put ``submission`` (a file or a folder) into ``submission/``, run
    ``run_autograder`` as Gradescope does — without ``setup.sh``: this environment already
    has moco-ref — and validate ``results/results.json`` against Gradescope's format."""
    zip_path, submission = Path(zip_path), Path(submission)
    if not submission.exists():
        raise PlatformError(f"no such file or folder: {submission}")
    if keep is not None:
        root = Path(keep).absolute()
        if root.exists() and any(root.iterdir()):
            raise PlatformError(f"--keep {root} is not empty")
        root.mkdir(parents=True, exist_ok=True)
        return _try_in(root, zip_path, submission, timeout, gradescope_problems)
    with tempfile.TemporaryDirectory(prefix="moco-ref-autograder-") as scratch:
        return _try_in(Path(scratch), zip_path, submission, timeout, gradescope_problems)


def _try_in(root: Path, zip_path: Path, submission: Path, timeout: float, problems_of):
    root = root.absolute()
    source, handed_in, results = root / "source", root / "submission", root / "results"
    for folder in (source, handed_in, results):
        folder.mkdir(parents=True, exist_ok=True)
    _unpack(zip_path, source)
    if submission.is_dir():
        shutil.copytree(submission, handed_in, dirs_exist_ok=True)
    else:
        shutil.copy2(submission, handed_in / submission.name)
    script = root / "run_autograder"
    shutil.copy2(source / "run_autograder", script)
    script.chmod(EXECUTABLE)
    env = dict(os.environ, **{ROOT_VARIABLE: str(root), PYTHON_VARIABLE: sys.executable})
    tried = run_and_validate([str(script)], root=root, env=env, timeout=timeout,
                             results=results / "results.json", what="run_autograder",
                             problems_of=problems_of)
    (results / "stdout").write_text(tried.stdout + tried.stderr, encoding="utf-8")
    return tried


