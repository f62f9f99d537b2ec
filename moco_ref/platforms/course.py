"""What every learning platform's package shares (``moco_ref.platforms``): building a course's
grader (the rubric file, this version's wheel, the pinned torch, the course secret made at
build time) and grading one handed-in folder the way a platform's container does (the
submission's main file found as batch grading finds it, the sandbox refused in one line for the
staff, a report that is never an exception). Each platform's package adds its own files, its
results writer and its local run; none reads another's.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import json
import re
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from moco_ref import __version__
from moco_ref.judge.registry import FAMILIES
from moco_ref.judge.results import SubmissionReport
from moco_ref.judge.rubric import DEFAULT_FAMILY_WEIGHTS, DEFAULT_RUBRIC, Rubric, load_rubric
from moco_ref.probe.options import STYLES, GradeOptions, probe_key_of

PYTHON_VARIABLE = "MOCO_REF_PYTHON"  # the interpreter run_autograder uses (default: the venv's)
CONFIG_NAME = "moco-ref-autograder.json"
RUBRIC_NAME = "rubric.toml"
SECRET_NAME = "moco-ref-course-secret"  # beside the rubric; made at build time
EXECUTABLE = 0o755
_SKIPPED_DIRS = {"__pycache__", "__MACOSX", ".git", ".ipynb_checkpoints", "node_modules"}
_SKIPPED_FILES = {"setup.py", "conftest.py"}


class PlatformError(ValueError):
    """Input a platform's commands cannot use, said in one line (exit 2)."""


def rubric_toml(rubric: Rubric = DEFAULT_RUBRIC) -> str:
    """``rubric`` as a TOML file ``load_rubric`` reads back (every family weight written)."""

    def number(value: float) -> str:
        return f"{value:g}" if float(value).is_integer() else repr(float(value))

    lines = [
        f"# The rubric of this autograder (moco-ref {__version__}); `moco-ref rubric show "
        "rubric.toml` prints the points of every check.",
        f"total = {number(rubric.total)}",
        "",
        "[families]",
    ]
    lines += [f'"{family}" = {number(rubric.families.get(family, DEFAULT_FAMILY_WEIGHTS[family]))}'
              for family in FAMILIES]
    lines += ["", "[checks]"]
    lines += [f'"{check}" = {number(weight)}' for check, weight in sorted(rubric.checks.items())]
    lines += ["", "[visibility]  # visible, after_due_date, after_published or hidden"]
    lines += [f'"{key}" = "{value}"' for key, value in sorted(rubric.visibility.items())]
    lines += ["", "[output]",
              f"show_submission_output = {str(rubric.show_submission_output).lower()}", ""]
    return "\n".join(lines)


def project_root() -> Path | None:
    """The source checkout moco-ref runs from, if it runs from one."""
    import moco_ref

    root = Path(moco_ref.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(r'(?m)^name\s*=\s*"moco-ref"', pyproject.read_text()):
        return root
    return None


def build_wheel(dest: Path) -> Path:
    """This version of moco-ref as a wheel in ``dest``, built from its source checkout with
    ``pip wheel`` (offline: no build isolation when setuptools is installed)."""
    root = project_root()
    if root is None:
        raise PlatformError("moco-ref is not running from its source checkout, so its wheel "
                              "cannot be built here: give --wheel FILE (a moco_ref wheel)")
    command = [sys.executable, "-m", "pip", "wheel", str(root), "--no-deps", "-q", "-w", str(dest)]
    if importlib.util.find_spec("setuptools") is not None:
        command.insert(5, "--no-build-isolation")
    # pip builds in the checkout (build/, *.egg-info): two builds at once would trip each other
    lock_path = Path(tempfile.gettempdir()) / "moco-ref-wheel-build.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("moco_ref-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel was written"])[-1]
        raise PlatformError(f"building the moco-ref wheel failed: {last}")
    return wheels[-1]


def _checked_wheel(path: Path) -> Path:
    if not path.is_file() or not path.name.startswith("moco_ref-") or path.suffix != ".whl":
        raise PlatformError(f"--wheel {path}: not a moco_ref wheel file")
    version = path.name.split("-")[1]
    if version != __version__:
        raise PlatformError(f"--wheel {path}: moco-ref {version}, but this is moco-ref "
                              f"{__version__} (the autograder pins the version that builds it)")
    return path


def torch_requirement() -> str:
    """The installed torch and torchvision, pinned (``torch==X torchvision==Y``), for a CPU
    wheel index; a bare name when one is not installed."""
    pins = []
    for name in ("torch", "torchvision"):
        try:
            version = importlib.metadata.version(name).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            pins.append(name)
            continue
        pins.append(f"{name}=={version}")
    return " ".join(pins)


def checked_choices(style: str | None, timeout: float | None) -> None:
    """``PlatformError`` when ``style`` or ``timeout`` (seconds per submission) is unusable."""
    if style is not None and style not in STYLES:
        raise PlatformError(f"--style must be one of {', '.join(STYLES)}, not {style!r}")
    if timeout is not None and not timeout > 0:
        raise PlatformError(f"--timeout must be > 0, not {timeout:g}")


def course_rubric(rubric_path=None) -> tuple[Rubric, str]:
    """The course's rubric and the TOML text to bundle: the file given (as written), or
    moco-ref's default written out; ``PlatformError`` when the file is unusable."""
    from moco_ref.judge.rubric import RubricError

    if rubric_path is None:
        return DEFAULT_RUBRIC, rubric_toml(DEFAULT_RUBRIC)
    try:
        rubric = load_rubric(rubric_path)
    except RubricError as exc:
        raise PlatformError(f"--rubric: {exc}") from None
    return rubric, Path(rubric_path).read_text(encoding="utf-8")


def bundled_wheel(wheel, scratch: Path) -> Path:
    """The moco-ref wheel to bundle: ``wheel`` (checked: a moco_ref wheel of this version) or
    one built from this checkout into ``scratch``."""
    return _checked_wheel(Path(wheel)) if wheel else build_wheel(Path(scratch))


class NoSubmission(Exception):
    """The submission folder holds nothing to grade (the message is for the student)."""


def _candidates(folder: Path) -> list[Path]:
    found = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part in _SKIPPED_DIRS or part.startswith(".") for part in relative.parts[:-1]):
            continue
        if (path.is_file() and path.suffix in (".py", ".ipynb")
                and not path.name.startswith((".", "_")) and path.name not in _SKIPPED_FILES
                and not path.name.startswith("test_")):
            found.append(path)
    return found


def find_submission(folder: Path) -> Path:
    """The submission's main file in ``folder``: the only ``.py``/``.ipynb`` file, or the one
    that defines the most MoCo entry points (``train_moco``, ``moco_warmup``, ``class MoCo``,
    …), chosen as batch grading chooses it (``moco_ref.run.intake.main_file``).
    ``NoSubmission`` (a sentence for the student) otherwise."""
    from moco_ref.probe.source import bound_entry_points
    from moco_ref.run.intake import main_file

    candidates = _candidates(folder)
    if not candidates:
        raise NoSubmission("the submission holds no .py file and no .ipynb notebook")
    if len(candidates) == 1:
        return candidates[0]
    if not any(bound_entry_points(path) for path in candidates):
        listed = ", ".join(p.relative_to(folder).as_posix() for p in candidates[:8])
        raise NoSubmission(f"none of the submission's files ({listed}) defines "
                           "train_moco, moco_warmup, MoCo or another MoCo entry point")
    return main_file(candidates)


def new_course_secret() -> str:
    """A course secret made when the autograder is built: the probe's sizes, ids and seed are
    drawn from it (``GradeOptions.probe_key``), so the platform's runs are not the README's
    documented default probe. It lives beside the rubric (Gradescope's ``source``,
    PrairieLearn's ``tests``), which no job can read; the grader reads it, never argv."""
    return secrets.token_hex(32) + "\n"


def read_config_in(folder: Path) -> tuple[dict, Rubric]:
    """The bundled config (``moco-ref-autograder.json``), rubric and course secret in
    ``folder`` (the default rubric when none is there, the documented default probe when no
    secret is); ``RubricError`` when the rubric is unusable."""
    config: dict = {}
    if (folder / CONFIG_NAME).is_file():
        config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    secret_file = folder / SECRET_NAME
    if secret_file.is_file() and secret_file.read_text(encoding="utf-8").strip():
        config["probe_key"] = probe_key_of(secret_file.read_text(encoding="utf-8").strip())
    rubric_file = folder / config.get("rubric", RUBRIC_NAME)
    rubric = load_rubric(rubric_file) if rubric_file.is_file() else DEFAULT_RUBRIC
    return config, rubric


@dataclass
class RunResult:
    report: SubmissionReport
    results_path: Path
    data: dict
    problem: str = ""  # for the staff: why nothing was graded (not shown to students)
    staff_notes: list[str] = field(default_factory=list)  # for the staff's log only


def sandbox_refusal(isolation: str | None = None) -> str:
    """"" when the sandbox ``isolation`` (None: the environment's default) can start here,
    else why not (one line)."""
    from moco_ref.sandbox.client import IsolationUnavailable, current_zygote

    try:
        current_zygote(isolation=isolation)
    except IsolationUnavailable as exc:
        return f"the sandbox cannot run here: {exc}"
    except ValueError as exc:  # a bad MOCO_REF_ISOLATION
        return str(exc)
    return ""


def grade_folder(folder: Path, config: dict, rubric: Rubric, *,
                 isolation: str | None = None) -> tuple[SubmissionReport, str]:
    """Grade the submission handed in as ``folder`` (its main file found by
    ``find_submission``) with the bundled ``config`` (style, timeout) and ``rubric``.
    Returns the report — not gradable, with a sentence for the student, when nothing could
    be graded — and the staff's problem ("" when none): never raises for what the
    submission is."""
    style = config.get("style")
    started = time.monotonic()
    try:
        target = find_submission(folder) if folder.is_dir() else None
        if target is None:
            raise NoSubmission("no submission was handed in")
    except NoSubmission as exc:
        report = SubmissionReport(str(folder / "submission"), style or "unknown",
                                  gradable=False, traceback=f"{exc}.")
        return _timed(report, started), ""
    problem = sandbox_refusal(isolation)
    if problem:
        report = SubmissionReport(
            str(target), style or "unknown", gradable=False,
            traceback="The autograder could not start its sandbox, so nothing was graded; "
                      "please tell the course staff.")
        return _timed(report, started), problem
    from moco_ref.run.pipeline import grade_submission  # torch: only when there is code

    options = GradeOptions(style=style, timeout=float(config.get("timeout")
                                                      or GradeOptions.timeout),
                           rubric=rubric.to_pairs(), probe_key=str(config.get("probe_key", "")))
    # one submission per run: the warm process is stopped before judging (issue 27: memory)
    report = grade_submission(str(target.absolute()), options, isolation=isolation,
                              single_run=True)
    return _timed(report, started), ""


def _timed(report: SubmissionReport, started: float) -> SubmissionReport:
    if not report.wall_seconds:
        report.wall_seconds = time.monotonic() - started
    return report


def grader_failure_report(seconds: float = 0.0) -> SubmissionReport:
    """The report of a run in which the grader itself failed: not gradable, and what the
    student reads says so (the traceback goes to the staff's log, not to the student)."""
    return SubmissionReport("submission", "unknown", gradable=False, wall_seconds=seconds,
                            traceback="The autograder failed while grading this submission; "
                                      "please tell the course staff.")


def write_results(root: Path, data: dict) -> Path:
    """``data`` as the platform's ``results/results.json`` under ``root``."""
    from moco_ref.report.text import dumps_strict

    path = root / "results" / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_strict(data), encoding="utf-8")
    return path
