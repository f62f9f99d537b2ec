"""Try a PrairieLearn package (``packager``) here, as PrairieLearn would
run it: lay out a ``/grade``-shaped tree (``data/data.json``, ``student/``, ``tests/``,
``results/``) in a temporary folder, run the entrypoint with ``$MOCO_REF_GRADE_ROOT``
pointing there — optionally as Docker's default profile runs a container
(``moco_ref.tools.default_container``) — and validate ``results/results.json`` against
PrairieLearn's documented format (``writer.prairielearn_problems``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from moco_ref.platforms.course import PYTHON_VARIABLE, PlatformError
from moco_ref.platforms.local_run import TryResult, run_and_validate
from moco_ref.platforms.prairielearn.packager import ENTRYPOINT_NAME, GRADE_ROOT_VARIABLE
from moco_ref.platforms.prairielearn.writer import prairielearn_problems

_EXECUTABLE = 0o755


PLTry = TryResult  # the same outcome: what the entry did and what its results lack


def _package_tests(outdir: Path) -> Path:
    tests = outdir / "question" / "tests"
    if not outdir.is_dir():
        raise PlatformError(f"no such folder: {outdir} (write it with `moco-ref "
                              "prairielearn build OUTDIR`)")
    if not (tests / ENTRYPOINT_NAME).is_file() or not (outdir / "question/info.json").is_file():
        raise PlatformError(f"{outdir} holds no question/info.json and question/tests/"
                              f"{ENTRYPOINT_NAME}: not a package `prairielearn build` wrote")
    return tests


def _checked_submissions(submissions) -> list[Path]:
    paths = [Path(s) for s in submissions]
    if not paths:
        raise PlatformError("give at least one SUBMISSION (a file or a folder)")
    names: dict[str, Path] = {}
    for path in paths:
        if not path.exists():
            raise PlatformError(f"no such file or folder: {path}")
        inside = [p.relative_to(path) for p in path.rglob("*") if p.is_file()] \
            if path.is_dir() else [Path(path.name)]
        for name in inside:
            if name.as_posix() in names:
                raise PlatformError(f"two submission files would both be student/{name}")
            names[name.as_posix()] = path
    return paths


def _lay_out(root: Path, tests_source: Path, submissions: list[Path]) -> None:
    """``root`` as PrairieLearn lays out ``/grade``: data/data.json, student/, tests/,
    results/ (empty)."""
    student, tests = root / "student", root / "tests"
    for folder in (root / "data", student, root / "results"):
        folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tests_source, tests, dirs_exist_ok=True)
    (tests / ENTRYPOINT_NAME).chmod(_EXECUTABLE)  # PrairieLearn does so before running it
    for path in submissions:
        if path.is_dir():
            shutil.copytree(path, student, dirs_exist_ok=True)
        else:
            shutil.copy2(path, student / path.name)
    files = [{"name": p.relative_to(student).as_posix(),
              "contents": base64.b64encode(p.read_bytes()).decode("ascii")}
             for p in sorted(student.rglob("*")) if p.is_file()]
    data = {"params": {}, "correct_answers": {}, "submitted_answers": {"_files": files},
            "format_errors": {}, "partial_scores": {}, "score": 0, "feedback": {},
            "variant_seed": 1, "options": {}, "raw_submitted_answers": {}, "gradable": True}
    (root / "data" / "data.json").write_text(json.dumps(data, indent=2) + "\n",
                                             encoding="utf-8")


def try_prairielearn(outdir, submissions, *, keep=None, timeout: float | None = None,
                     isolation: str | None = None, default_container: bool = False) -> PLTry:
    """Lay out a ``/grade`` tree (``keep``, or a temporary folder) with the package in
    ``outdir`` and the ``submissions`` (files or folders, together one student's
    submission), run the entrypoint as PrairieLearn does — this environment already has
    moco-ref, so no image is built — within ``timeout`` (default: the package's job
    timeout), and validate ``results/results.json`` against PrairieLearn's format.
    ``isolation`` reaches the grading as ``$MOCO_REF_ISOLATION``; ``default_container``
    runs the entrypoint as Docker's default profile would (``tools.default_container``:
    root without CAP_SYS_ADMIN, namespaces refused)."""
    outdir = Path(outdir)
    tests_source = _package_tests(outdir)
    paths = _checked_submissions(submissions)
    if timeout is None:
        timeout = float(json.loads((outdir / "question/info.json").read_text(
            encoding="utf-8")).get("externalGradingOptions", {}).get("timeout") or 30)
    if keep is not None:
        root = Path(keep).absolute()
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise PlatformError(f"--keep {root} is not an empty folder")
        root.mkdir(parents=True, exist_ok=True)
        return _try_in(root, tests_source, paths, timeout, isolation, default_container,
                       prairielearn_problems)
    with tempfile.TemporaryDirectory(prefix="moco-ref-prairielearn-") as scratch:
        return _try_in(Path(scratch), tests_source, paths, timeout, isolation,
                       default_container, prairielearn_problems)


def _try_in(root: Path, tests_source: Path, submissions: list[Path], timeout: float,
            isolation: str | None, default_container: bool, problems_of) -> PLTry:
    root = root.absolute()
    _lay_out(root, tests_source, submissions)
    argv = [str(root / "tests" / ENTRYPOINT_NAME)]
    if default_container:
        from moco_ref.tools.default_container import command

        argv = command(argv)
    env = dict(os.environ, **{GRADE_ROOT_VARIABLE: str(root), PYTHON_VARIABLE: sys.executable})
    if isolation:
        from moco_ref.sandbox.client import ISOLATION_VARIABLE

        env[ISOLATION_VARIABLE] = isolation
    return run_and_validate(argv, root=root, env=env, timeout=timeout,
                            results=root / "results" / "results.json", what="the entrypoint",
                            problems_of=problems_of)


