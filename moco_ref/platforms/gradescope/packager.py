"""Gradescope's autograder made of moco-ref: build its zip, and run it for one submission the
way Gradescope does (``local_run`` tries a zip here).

The zip holds ``setup.sh`` (run once by Gradescope when it builds the image: a Python ≥ 3.11
virtual environment with CPU torch and the moco-ref wheel inside the zip), ``run_autograder``
(run for every submission: it calls ``moco-ref gradescope run``), the course's
``rubric.toml``, ``moco-ref-autograder.json`` (style and timeout), the course secret and
``wheels/`` (this version of moco-ref). Everything lives under ``/autograder`` — or under
``$MOCO_REF_AUTOGRADER_ROOT``, which is how ``local_run.try_autograder`` runs it in a
temporary tree.

What grading one submission needs (``run_needs.RUN_NEEDS``: memory and seconds, measured)
is stated by the build; when Gradescope's ``submission_metadata.json`` is there, a rubric
total other than the assignment's ``total_points`` is told to the staff (the run's stderr),
never in ``results.json``. The wheel, the rubric file, the submission finder and the grading
core are every platform's (``moco_ref.platforms.course``).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from moco_ref import __version__
from moco_ref.judge.rubric import Rubric
from moco_ref.platforms.course import (
    CONFIG_NAME,
    EXECUTABLE,
    RUBRIC_NAME,
    SECRET_NAME,
    PlatformError,
    RunResult,
    bundled_wheel,
    checked_choices,
    course_rubric,
    grade_folder,
    grader_failure_report,
    new_course_secret,
    read_config_in,
    torch_requirement,
    write_results,
)
from moco_ref.platforms.gradescope.writer import gradescope_results
from moco_ref.probe.options import GradeOptions
from moco_ref.tools.run_needs import RUN_NEEDS

ROOT_VARIABLE = "MOCO_REF_AUTOGRADER_ROOT"
METADATA_VARIABLE = "MOCO_REF_SUBMISSION_METADATA"  # Gradescope's metadata file (tests)
METADATA_NAME = "submission_metadata.json"
DEFAULT_ROOT = "/autograder"
WHEELS = "wheels"
REQUIRED_MEMBERS = ("setup.sh", "run_autograder")




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












@dataclass
class BuildResult:
    path: Path
    members: list[str]
    rubric: Rubric
    config: dict








def build_autograder(out, *, rubric_path=None, style: str | None = None,
                     timeout: float | None = None, wheel=None) -> BuildResult:
    """Write the autograder zip to ``out``; ``PlatformError`` for unusable input."""
    checked_choices(style, timeout)
    rubric, rubric_text = course_rubric(rubric_path)
    out = Path(out)
    if out.is_dir():
        raise PlatformError(f"--out {out} is a folder: give the zip file to write")
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








def autograder_root(root=None) -> Path:
    return Path(root or os.environ.get(ROOT_VARIABLE) or DEFAULT_ROOT).absolute()






def read_config(root: Path) -> tuple[dict, Rubric]:
    return read_config_in(root / "source")










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
    root = autograder_root(root)
    folder = root / "submission"
    config, rubric = read_config(root)
    notes = [note for note in (total_points_note(rubric, metadata_path(root, metadata)),)
             if note]
    report, problem = grade_folder(folder, config, rubric)
    data = gradescope_results(report, rubric=rubric, submission_root=folder.absolute())
    return RunResult(report, write_results(root, data), data, problem, notes)






def write_failure_results(root=None, seconds: float = 0.0) -> Path:
    """A valid results.json saying that the autograder itself failed."""
    return write_results(autograder_root(root), gradescope_results(
        grader_failure_report(seconds)))
