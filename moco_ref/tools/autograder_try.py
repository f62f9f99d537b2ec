"""Try a Gradescope autograder zip here, as Gradescope would run it, without ``setup.sh``
(this environment already has moco-ref): unpack it into an ``/autograder``-shaped tree, put
the submission in, run ``run_autograder``, and validate ``results/results.json`` against
Gradescope's format (``moco-ref gradescope test``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from moco_ref.tools.autograder import (
    EXECUTABLE,
    PYTHON_VARIABLE,
    REQUIRED_MEMBERS,
    ROOT_VARIABLE,
    AutograderError,
)


@dataclass
class TryResult:
    root: Path
    returncode: int
    data: dict | None
    problems: list[str] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""

    @property
    def valid(self) -> bool:
        return self.data is not None and not self.problems


def _unpack(zip_path: Path, source: Path) -> None:
    if not zip_path.is_file():
        raise AutograderError(f"no such file: {zip_path}")
    if not zipfile.is_zipfile(zip_path):
        raise AutograderError(f"{zip_path} is not a zip file")
    with zipfile.ZipFile(zip_path) as archive:
        names = archive.namelist()
        missing = [name for name in REQUIRED_MEMBERS if name not in names]
        if missing:
            raise AutograderError(f"{zip_path} has no {missing[0]} at its root (Gradescope "
                                  "needs setup.sh and run_autograder there)")
        for name in names:
            target = (source / name).resolve()
            if not target.is_relative_to(source.resolve()):
                raise AutograderError(f"{zip_path}: member {name!r} would land outside the "
                                      "autograder's source folder")
        archive.extractall(source)


def try_autograder(zip_path, submission, *, keep=None, timeout: float = 900.0) -> TryResult:
    """Unpack ``zip_path`` into an ``/autograder``-shaped tree (``keep``, or a temporary
    folder), put ``submission`` (a file or a folder) into ``submission/``, run
    ``run_autograder`` as Gradescope does — without ``setup.sh``: this environment already
    has moco-ref — and validate ``results/results.json`` against Gradescope's format."""
    from moco_ref.report.lms import gradescope_problems

    zip_path, submission = Path(zip_path), Path(submission)
    if not submission.exists():
        raise AutograderError(f"no such file or folder: {submission}")
    if keep is not None:
        root = Path(keep).absolute()
        if root.exists() and any(root.iterdir()):
            raise AutograderError(f"--keep {root} is not empty")
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


def run_and_validate(argv: list[str], *, root: Path, env: dict, timeout: float, results: Path,
                     what: str, problems_of) -> TryResult:
    """Run a platform's entry (``argv``, named ``what`` in the problems) in ``root`` within
    ``timeout`` seconds, then read ``results`` and list what ``problems_of`` finds wrong with
    it (shared by ``gradescope test`` and ``prairielearn test``)."""
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, stdout = -1, _text(exc.stdout)
        stderr = _text(exc.stderr) + (f"\n{what} ran out of its {timeout:g} s (after "
                                      f"{time.monotonic() - started:.0f} s)")
    if not results.is_file():
        return TryResult(root, returncode, None,
                         [f"{what} wrote no {results.parent.name}/{results.name}"],
                         stdout, stderr)
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return TryResult(root, returncode, None, [f"{results.name} is not JSON: {exc}"],
                         stdout, stderr)
    return TryResult(root, returncode, data, problems_of(data), stdout, stderr)


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
