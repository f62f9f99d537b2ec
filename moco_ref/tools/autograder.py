"""A Gradescope autograder made of moco-ref: build its zip, and run it for one submission the
way Gradescope does (``autograder_try`` tries a zip locally).

The zip holds ``setup.sh`` (run once by Gradescope when it builds the image: a Python ≥ 3.11
virtual environment with CPU torch and the moco-ref wheel inside the zip), ``run_autograder``
(run for every submission: it calls ``moco-ref gradescope run``), the course's
``rubric.toml``, ``moco-ref-autograder.json`` (style and timeout) and ``wheels/`` (this
version of moco-ref). Everything lives under ``/autograder`` — or under
``$MOCO_REF_AUTOGRADER_ROOT``, which is how ``autograder_try.try_autograder`` runs it in a
temporary tree.

What grading one submission needs (``run_needs.RUN_NEEDS``: memory and seconds, measured)
is stated by the build; when Gradescope's ``submission_metadata.json`` is there, a rubric
total other than the assignment's ``total_points`` is told to the staff (the run's stderr),
never in ``results.json``. The PrairieLearn package (``moco_ref.tools.prairielearn``) reuses the
wheel, the rubric file, the submission finder and the grading core of this module.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import json
import os
import re
import secrets
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from moco_ref import __version__
from moco_ref.judge.registry import FAMILIES
from moco_ref.judge.results import SubmissionReport
from moco_ref.judge.rubric import DEFAULT_FAMILY_WEIGHTS, DEFAULT_RUBRIC, Rubric, load_rubric
from moco_ref.probe.options import STYLES, GradeOptions, probe_key_of
from moco_ref.tools.run_needs import RUN_NEEDS

ROOT_VARIABLE = "MOCO_REF_AUTOGRADER_ROOT"
METADATA_VARIABLE = "MOCO_REF_SUBMISSION_METADATA"  # Gradescope's metadata file (tests)
METADATA_NAME = "submission_metadata.json"
PYTHON_VARIABLE = "MOCO_REF_PYTHON"  # the interpreter run_autograder uses (default: the venv's)
DEFAULT_ROOT = "/autograder"
CONFIG_NAME = "moco-ref-autograder.json"
RUBRIC_NAME = "rubric.toml"
WHEELS = "wheels"
REQUIRED_MEMBERS = ("setup.sh", "run_autograder")
SECRET_NAME = "moco-ref-course-secret"  # beside the rubric; made at build time
EXECUTABLE = 0o755
_SKIPPED_DIRS = {"__pycache__", "__MACOSX", ".git", ".ipynb_checkpoints", "node_modules"}
_SKIPPED_FILES = {"setup.py", "conftest.py"}


class AutograderError(ValueError):
    """Input the autograder commands cannot use, said in one line (exit 2)."""


# --------------------------------------------------------------------------- the scripts

SETUP_SH = r"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image: a Python >= 3.11
# virtual environment with CPU torch and moco-ref {version} (the wheel in this zip).
set -euo pipefail
ROOT="${{MOCO_REF_AUTOGRADER_ROOT:-/autograder}}"
SOURCE="$ROOT/source"
VENV="$ROOT/moco-ref-venv"

pick_python() {{
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}}

PYTHON="$(pick_python || true)"
if [ -z "$PYTHON" ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y python3.11 python3.11-venv
  PYTHON=python3.11
fi
if ! "$PYTHON" -m venv "$VENV"; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y "$(basename "$PYTHON")-venv"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade pip
"$VENV/bin/python" -m pip install {torch} --index-url https://download.pytorch.org/whl/cpu
"$VENV/bin/python" -m pip install "$SOURCE/{wheel}"
"$VENV/bin/python" -m moco_ref.cli --version
# What a submission's sandbox sees in this image (informational; grading refuses to run
# untrusted code if the sandbox cannot start).
"$VENV/bin/python" -m moco_ref.cli doctor || echo "moco-ref doctor failed: see above"
"""

RUN_AUTOGRADER = r"""#!/usr/bin/env bash
# Gradescope runs this for every submission: moco-ref grades /autograder/submission with the
# rubric in /autograder/source and writes /autograder/results/results.json.
set -uo pipefail
ROOT="${MOCO_REF_AUTOGRADER_ROOT:-/autograder}"
PYTHON="${MOCO_REF_PYTHON:-$ROOT/moco-ref-venv/bin/python}"
cd "$ROOT"
exec "$PYTHON" -m moco_ref.cli gradescope run --root "$ROOT"
"""


# --------------------------------------------------------------------------- build


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
        raise AutograderError("moco-ref is not running from its source checkout, so its wheel "
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
        raise AutograderError(f"building the moco-ref wheel failed: {last}")
    return wheels[-1]


def _checked_wheel(path: Path) -> Path:
    if not path.is_file() or not path.name.startswith("moco_ref-") or path.suffix != ".whl":
        raise AutograderError(f"--wheel {path}: not a moco_ref wheel file")
    version = path.name.split("-")[1]
    if version != __version__:
        raise AutograderError(f"--wheel {path}: moco-ref {version}, but this is moco-ref "
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


@dataclass
class BuildResult:
    path: Path
    members: list[str]
    rubric: Rubric
    config: dict


def checked_choices(style: str | None, timeout: float | None) -> None:
    """``AutograderError`` when ``style`` or ``timeout`` (seconds per submission) is unusable."""
    if style is not None and style not in STYLES:
        raise AutograderError(f"--style must be one of {', '.join(STYLES)}, not {style!r}")
    if timeout is not None and not timeout > 0:
        raise AutograderError(f"--timeout must be > 0, not {timeout:g}")


def course_rubric(rubric_path=None) -> tuple[Rubric, str]:
    """The course's rubric and the TOML text to bundle: the file given (as written), or
    moco-ref's default written out; ``AutograderError`` when the file is unusable."""
    from moco_ref.judge.rubric import RubricError

    if rubric_path is None:
        return DEFAULT_RUBRIC, rubric_toml(DEFAULT_RUBRIC)
    try:
        rubric = load_rubric(rubric_path)
    except RubricError as exc:
        raise AutograderError(f"--rubric: {exc}") from None
    return rubric, Path(rubric_path).read_text(encoding="utf-8")


def bundled_wheel(wheel, scratch: Path) -> Path:
    """The moco-ref wheel to bundle: ``wheel`` (checked: a moco_ref wheel of this version) or
    one built from this checkout into ``scratch``."""
    return _checked_wheel(Path(wheel)) if wheel else build_wheel(Path(scratch))


def build_autograder(out, *, rubric_path=None, style: str | None = None,
                     timeout: float | None = None, wheel=None) -> BuildResult:
    """Write the autograder zip to ``out``; ``AutograderError`` for unusable input."""
    checked_choices(style, timeout)
    rubric, rubric_text = course_rubric(rubric_path)
    out = Path(out)
    if out.is_dir():
        raise AutograderError(f"--out {out} is a folder: give the zip file to write")
    config = {"moco_ref_version": __version__, "style": style,
              "timeout": timeout if timeout is not None else GradeOptions.timeout,
              "rubric": RUBRIC_NAME, "needs": RUN_NEEDS.as_dict()}
    with tempfile.TemporaryDirectory(prefix="moco-ref-wheel-") as scratch:
        wheel_path = bundled_wheel(wheel, Path(scratch))
        wheel_member = f"{WHEELS}/{wheel_path.name}"
        config["wheel"] = wheel_member
        scripts = {
            "setup.sh": SETUP_SH.format(version=__version__, torch=torch_requirement(),
                                        wheel=wheel_member),
            "run_autograder": RUN_AUTOGRADER,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, text in scripts.items():
                info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
                info.external_attr = (stat.S_IFREG | EXECUTABLE) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, text)
            archive.writestr(RUBRIC_NAME, rubric_text)
            archive.writestr(CONFIG_NAME, json.dumps(config, indent=2) + "\n")
            archive.writestr(SECRET_NAME, new_course_secret())
            archive.write(wheel_path, wheel_member)
            members = archive.namelist()
        os.replace(partial, out)
    return BuildResult(out, members, rubric, config)


# --------------------------------------------------------------------------- run


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


def autograder_root(root=None) -> Path:
    return Path(root or os.environ.get(ROOT_VARIABLE) or DEFAULT_ROOT).absolute()


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


def read_config(root: Path) -> tuple[dict, Rubric]:
    return read_config_in(root / "source")


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


def metadata_path(root: Path, metadata=None) -> Path:
    """Gradescope's ``submission_metadata.json``: ``metadata``, else
    ``$MOCO_REF_SUBMISSION_METADATA``, else the one under the autograder's root."""
    return Path(metadata or os.environ.get(METADATA_VARIABLE) or root / METADATA_NAME)


def total_points_note(rubric: Rubric, path: Path) -> str:
    """A note for the staff when the Gradescope assignment's ``total_points`` (in ``path``,
    the submission's metadata) is not the rubric's total; "" when they agree, or when the
    file is absent or names no total. Never shown to students."""
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ""
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return f"note for the staff: {path.name} could not be read ({type(exc).__name__})"
    assignment = metadata.get("assignment") if isinstance(metadata, dict) else None
    total = assignment.get("total_points") if isinstance(assignment, dict) else None
    try:
        total = float(total)
    except (TypeError, ValueError):
        return ""
    if abs(total - rubric.total) < 0.005:
        return ""
    return (f"note for the staff: the rubric's total is {rubric.total:g} points but this "
            f"Gradescope assignment's total_points is {total:g}: scores are out of "
            f"{rubric.total:g}; set the assignment's points or the rubric's total to match")


def grade_in_autograder(root=None, *, metadata=None) -> RunResult:
    """What ``run_autograder`` does: grade the submission under ``root``/submission with the
    bundled rubric and write ``root``/results/results.json (always, even when nothing could
    be graded). ``metadata``: Gradescope's ``submission_metadata.json`` (``metadata_path``);
    a total that differs from the rubric's becomes a staff note (``RunResult.staff_notes``)."""
    from moco_ref.report.lms import gradescope_results

    root = autograder_root(root)
    folder = root / "submission"
    config, rubric = read_config(root)
    notes = [note for note in (total_points_note(rubric, metadata_path(root, metadata)),)
             if note]
    report, problem = grade_folder(folder, config, rubric)
    data = gradescope_results(report, rubric=rubric, submission_root=folder.absolute())
    return RunResult(report, write_results(root, data), data, problem, notes)


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


def write_failure_results(root=None, seconds: float = 0.0) -> Path:
    """A valid results.json saying that the autograder itself failed."""
    from moco_ref.report.lms import gradescope_results

    return write_results(autograder_root(root), gradescope_results(
        grader_failure_report(seconds)))
