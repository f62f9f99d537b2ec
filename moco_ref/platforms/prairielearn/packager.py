"""A PrairieLearn external grader made of moco-ref: write what a course needs, and grade one
submission the way the grading container does (``prairielearn_try`` tries it here).

``build_prairielearn(OUTDIR)`` writes::

    OUTDIR/README.md                       what goes where, and what one run needs
    OUTDIR/image/Dockerfile                the grader image: a slim Python, CPU torch, moco-ref
    OUTDIR/image/moco_ref-<version>-….whl  this version of moco-ref (built from this checkout)
    OUTDIR/question/info.json              the question, its externalGradingOptions included
    OUTDIR/question/question.html          a file upload and the grader's results
    OUTDIR/question/tests/run.sh           the entrypoint (PrairieLearn copies tests/ to
    OUTDIR/question/tests/rubric.toml        /grade/tests and makes run.sh executable)
    OUTDIR/question/tests/moco-ref-autograder.json   style, timeout, what one run needs

In the container ``run.sh`` calls ``moco-ref prairielearn run``, which grades the files in
``/grade/student`` and always writes ``/grade/results/results.json``. The grade root is
``$MOCO_REF_GRADE_ROOT`` (default ``/grade``), which is how
``local_run`` runs the entrypoint in a temporary ``/grade``-shaped tree. The wheel, the rubric
file, the submission finder and the grading core are every platform's
(``moco_ref.platforms.course``).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import tempfile
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

from moco_ref import __version__
from moco_ref.judge.rubric import Rubric
from moco_ref.platforms.course import (
    CONFIG_NAME,
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
from moco_ref.platforms.prairielearn.writer import prairielearn_results
from moco_ref.probe.options import GradeOptions
from moco_ref.tools.run_needs import RUN_NEEDS

GRADE_ROOT_VARIABLE = "MOCO_REF_GRADE_ROOT"
DEFAULT_GRADE_ROOT = "/grade"
ENTRYPOINT_NAME = "run.sh"
ENTRYPOINT = f"{DEFAULT_GRADE_ROOT}/tests/{ENTRYPOINT_NAME}"
DEFAULT_IMAGE = f"moco-ref-grader:{__version__}"
DEFAULT_FILE_NAME = "moco.py"
PL_MAX_TIMEOUT = 600  # PrairieLearn kills a grading job after at most this many seconds
MARGIN_SECONDS = 30  # on top of the submission's budget and one run's start-up and judging
_EXECUTABLE = 0o755
_IMAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._/:@-]*$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.(py|ipynb)$")

# --------------------------------------------------------------------------- the files

DOCKERFILE = """\
# The PrairieLearn external grader of moco-ref {version}. Build and push it where PrairieLearn
# can pull it (Docker Hub), under the name the question's info.json gives:
#   docker build -t {image} . && docker push {image}
FROM python:{python}-slim

# CPU-only torch from PyTorch's CPU wheel index: the default index's torch carries CUDA
# libraries (gigabytes) that a grading container without a GPU never loads.
RUN pip install --no-cache-dir {torch} --index-url https://download.pytorch.org/whl/cpu

# moco-ref itself (the wheel beside this file), and matplotlib for the figures of a failed
# check in results.json's images.
COPY {wheel} /opt/moco-ref/{wheel}
RUN pip install --no-cache-dir /opt/moco-ref/{wheel} "matplotlib>=3.7" \\
    && python -m moco_ref.cli --version

{needs}
"""

RUN_SH = r"""#!/usr/bin/env bash
# PrairieLearn runs this for every submission: moco-ref grades the files in /grade/student
# with the rubric beside this script and writes /grade/results/results.json (always).
set -uo pipefail
GRADE="${MOCO_REF_GRADE_ROOT:-/grade}"
PYTHON="${MOCO_REF_PYTHON:-python3}"
mkdir -p "$GRADE/results"
cd "$GRADE"
exec "$PYTHON" -m moco_ref.cli prairielearn run --root "$GRADE"
"""

QUESTION_HTML = """\
<pl-question-panel>
  <p>Upload your MoCo implementation as <code>{file_name}</code>. moco-ref runs it in a
  sandbox and holds it to the reference MoCo: each check below names what it verified.</p>
  <pl-file-upload file-names="{file_name}"></pl-file-upload>
</pl-question-panel>

<pl-submission-panel>
  <pl-external-grader-results></pl-external-grader-results>
  <pl-file-preview></pl-file-preview>
</pl-submission-panel>
"""

README = """\
# moco-ref {version} as a PrairieLearn external grader

- `image/`: the grader image. `docker build -t {image} image/ && docker push {image}`
  (PrairieLearn pulls it from Docker Hub: use your account's name, and the same name in
  `question/info.json`).
- `question/`: copy it under your course's `questions/` (rename the folder as you like). Its
  `tests/` folder holds the entrypoint, the rubric (`rubric.toml`: `moco-ref rubric show`
  prints its points) and the grading options; PrairieLearn copies it to `/grade/tests`.
- Try it here first: `moco-ref prairielearn test {outdir} SUBMISSION.py`.

One run needs {needs}.

The job's timeout in `info.json` is {timeout} s: the submission's {budget:g} s, one run's
start-up and judging, and a margin (PrairieLearn allows at most 600 s).
"""


def _comment(text: str) -> str:
    return "\n".join(textwrap.wrap(text, 94, initial_indent="# ", subsequent_indent="# "))


def needed_timeout(budget: float) -> int:
    """PrairieLearn's job timeout for a submission budget of ``budget`` seconds: the budget,
    one measured run (start-up, warm process, judging) and a margin; ``PlatformError`` when
    that exceeds PrairieLearn's 600 s."""
    needed = math.ceil(budget + RUN_NEEDS.seconds + MARGIN_SECONDS)
    if needed > PL_MAX_TIMEOUT:
        most = PL_MAX_TIMEOUT - RUN_NEEDS.seconds - MARGIN_SECONDS
        raise PlatformError(f"--timeout {budget:g} needs a {needed} s grading job, over "
                              f"PrairieLearn's {PL_MAX_TIMEOUT} s: give at most {most} s")
    return needed


def info_json(*, image: str, timeout: int, title: str, question_uuid: str) -> dict:
    """The question's ``info.json``: externally graded by ``image`` through the entrypoint in
    its ``tests/`` folder, within ``timeout`` seconds."""
    return {
        "uuid": question_uuid,
        "title": title,
        "topic": "MoCo",
        "tags": ["moco-ref", "code"],
        "type": "v3",
        "singleVariant": True,
        "gradingMethod": "External",
        "externalGradingOptions": {
            "enabled": True,
            "image": image,
            "entrypoint": ENTRYPOINT,
            "timeout": timeout,
        },
    }


def _kept_uuid(path: Path) -> str:
    """The uuid of an ``info.json`` built before (a rebuild is the same question), else new."""
    try:
        old = json.loads(path.read_text(encoding="utf-8")).get("uuid")
        return str(uuid.UUID(str(old)))
    except (OSError, ValueError, AttributeError, TypeError):
        return str(uuid.uuid4())


@dataclass
class PLBuild:
    outdir: Path
    files: list[str]
    rubric: Rubric
    info: dict
    config: dict


def build_prairielearn(outdir, *, rubric_path=None, style: str | None = None,
                       timeout: float | None = None, wheel=None, image: str = DEFAULT_IMAGE,
                       file_name: str = DEFAULT_FILE_NAME,
                       title: str = "MoCo implementation (graded by moco-ref)") -> PLBuild:
    """Write the PrairieLearn package into ``outdir`` (the module's docstring lists it);
    ``PlatformError`` for unusable input, before anything is written."""
    checked_choices(style, timeout)
    if not _IMAGE_NAME.match(image or ""):
        raise PlatformError(f"--image {image!r}: not a Docker image name (lowercase, e.g. "
                              "you/moco-grader:1)")
    if not _FILE_NAME.match(file_name or ""):
        raise PlatformError(f"--file-name {file_name!r}: give a plain .py or .ipynb name")
    rubric, rubric_text = course_rubric(rubric_path)
    outdir = Path(outdir)
    if outdir.exists() and not outdir.is_dir():
        raise PlatformError(f"{outdir} is a file: give the folder to write the package in")
    budget = timeout if timeout is not None else GradeOptions.timeout
    job_timeout = needed_timeout(budget)
    image_dir, question, tests = outdir / "image", outdir / "question", outdir / "question/tests"
    config = {"moco_ref_version": __version__, "style": style, "timeout": budget,
              "rubric": RUBRIC_NAME, "job_timeout": job_timeout, "needs": RUN_NEEDS.as_dict()}
    info = info_json(image=image, timeout=job_timeout, title=title,
                     question_uuid=_kept_uuid(question / "info.json"))
    with tempfile.TemporaryDirectory(prefix="moco-ref-wheel-") as scratch:
        wheel_path = bundled_wheel(wheel, Path(scratch))
        for folder in (image_dir, tests):
            folder.mkdir(parents=True, exist_ok=True)
        for old in image_dir.glob("moco_ref-*.whl"):
            old.unlink()
        shutil.copy2(wheel_path, image_dir / wheel_path.name)
        config["wheel"] = wheel_path.name
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    texts = {
        image_dir / "Dockerfile": DOCKERFILE.format(
            version=__version__, image=image, python=python, torch=torch_requirement(),
            wheel=wheel_path.name, needs=_comment(f"One run needs {RUN_NEEDS.text()}.")),
        question / "info.json": json.dumps(info, indent=2) + "\n",
        question / "question.html": QUESTION_HTML.format(file_name=file_name),
        tests / ENTRYPOINT_NAME: RUN_SH,
        tests / RUBRIC_NAME: rubric_text,
        tests / CONFIG_NAME: json.dumps(config, indent=2) + "\n",
        outdir / "README.md": README.format(version=__version__, image=image, outdir=outdir,
                                            needs=RUN_NEEDS.text(), timeout=job_timeout,
                                            budget=budget),
    }
    for path, text in texts.items():
        path.write_text(text, encoding="utf-8")
    (tests / ENTRYPOINT_NAME).chmod(_EXECUTABLE)
    secret = tests / SECRET_NAME  # kept across rebuilds: the course's probe stays its own
    if not secret.is_file() or not secret.read_text(encoding="utf-8").strip():
        secret.write_text(new_course_secret(), encoding="utf-8")
    secret.chmod(0o600)
    files = sorted([p.relative_to(outdir).as_posix() for p in texts]
                   + [f"image/{wheel_path.name}", secret.relative_to(outdir).as_posix()])
    return PLBuild(outdir, files, rubric, info, config)


# --------------------------------------------------------------------------- run


def grade_root(root=None) -> Path:
    return Path(root or os.environ.get(GRADE_ROOT_VARIABLE) or DEFAULT_GRADE_ROOT).absolute()


def grade_in_prairielearn(root=None, *, isolation: str | None = None) -> RunResult:
    """What the entrypoint does: grade ``root``/student with the rubric and options in
    ``root``/tests and write ``root``/results/results.json (always, even when nothing
    could be graded). ``RubricError`` when the bundled rubric is unusable (the caller writes
    ``write_failure_results``)."""
    root = grade_root(root)
    folder = root / "student"
    config, rubric = read_config_in(root / "tests")
    report, problem = grade_folder(folder, config, rubric, isolation=isolation)
    data = prairielearn_results(report, rubric, submission_root=folder.absolute(),
                                draw_figures=True)  # none without matplotlib
    return RunResult(report, write_results(root, data), data, problem)


def write_failure_results(root=None, seconds: float = 0.0) -> Path:
    """A valid results.json saying that the grader itself failed (not gradable, so the
    student loses no attempt)."""
    return write_results(grade_root(root), prairielearn_results(
        grader_failure_report(seconds)))
