"""PrairieLearn's external-grader results for one submission, written for the student who
handed it in (never a path of the grading machine, a local command, or the submission's own
output unless the rubric says so) from ``StudentView`` with PrairieLearn's ``SHOWING``.

PrairieLearn (no release step: what the results say, the student sees at once). A check is in
``tests[]`` only when ``Rubric.shown_now``: ``hidden`` checks are left out, and
``after_due_date``/``after_published`` ones are treated as hidden until the teacher grades
with ``--release-feedback`` (``Rubric.released``). ``score`` counts only the listed tests:
the points of the checks shown over their maximum (a fraction in [0, 1] consistent with
``tests[]``; 0 when nothing is shown), since a total that counted a left-out check would tell
its outcome. The course's full score is in moco-ref's own reports and gradebook. The message
says how many checks are left out, not what they found.

``prairielearn_problems`` checks a results dict against PrairieLearn's documented format
(``results.schema.json`` beside this module, plus its 1 MB limit).
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

from moco_ref import __version__
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC, Rubric
from moco_ref.platforms.results import points, schema_problems
from moco_ref.report.scoring import points_str
from moco_ref.report.student_view import Showing, StudentView
from moco_ref.report.text import (
    dumps_strict,
    one_line_reason,
    shown_name,
    student_text,
    submission_folder,
    submission_name,
)
from moco_ref.report.writers import Writer

SCHEMA_PATH = Path(__file__).with_name("results.schema.json")
MAX_BYTES = 1_000_000  # PrairieLearn's limit on results.json
IMAGE_BUDGET_BYTES = 600_000  # the figures' share of it (base64 included)
# PrairieLearn shows what it receives at once: only the checks shown now are sent
SHOWING = Showing("prairielearn", releases_itself=False, hides_total_while_withheld=False)


def prairielearn_results(
    report: SubmissionReport,
    rubric: Rubric | None = None,
    *,
    submission_root: Path | str | None = None,
    draw_figures: bool = False,
) -> dict:
    """PrairieLearn's external-grader results: ``gradable``, ``score`` (a fraction in [0,
    1]), ``message``, ``output`` and ``tests[]`` (``name``, ``description``, ``points``,
    ``max_points``, ``message``, ``output``, and with ``draw_figures`` the ``images`` of a
    visible check that did not pass, within ``IMAGE_BUDGET_BYTES``), student-safe like
    Gradescope's.

    Only the checks ``Rubric.shown_now`` are tests, and ``score`` is their points over their
    maximum (see the module's docstring). A submission that is not gradable is
    ``gradable: false`` (PrairieLearn then awards nothing and charges no attempt) with the
    reason as the message and as its one ``format_errors`` entry."""
    return results_of(StudentView(report, rubric or DEFAULT_RUBRIC, SHOWING),
                      submission_root=submission_root, draw_figures=draw_figures)


def results_of(view: StudentView, *, submission_root: Path | str | None = None,
               draw_figures: bool = False) -> dict:
    """The results from the student's view on PrairieLearn (``prairielearn_results``)."""
    report, rubric = view.report, view.rubric
    root = Path(submission_root) if submission_root is not None else submission_folder(report)
    name = shown_name(submission_name(report, root))
    output = ""
    if rubric.show_submission_output:
        output = "\n".join(part for part in (student_text(report.stdout, root),
                                              student_text(report.stderr, root)) if part)
    if not report.gradable:
        trace = student_text(report.traceback, root).strip()
        reason = one_line_reason(trace) or "the submission could not run"
        return {
            "gradable": False,
            "score": 0.0,
            "message": f"{name} could not be graded: {reason}",
            "output": "\n\n".join(part for part in (trace, output) if part),
            "format_errors": [reason],
            "tests": [],
        }
    tests = []
    budget = [IMAGE_BUDGET_BYTES]
    listed, shown = view.listed, view.shown
    for result in shown:
        message = student_text(result.message, root).strip()
        if result.status is Status.PASSED:
            text, details = "passed", message
        else:
            text = f"{result.status.value}: {one_line_reason(message) or result.status.value}"
            details = "" if result.status is Status.NOT_JUDGED else message
        test = {
            "name": f"{result.check_id}: {result.title}",
            "description": f"family {result.family}",
            "points": points(result.points),
            "max_points": points(result.max_points),
            "message": text,
            "output": details,
        }
        images = _images(result, budget) if draw_figures else []
        if images:
            test["images"] = images
        tests.append(test)
    earned, most = view.shown_score, view.shown_max_score
    fraction = earned / most if most > 0 else 0.0
    fraction = min(1.0, max(0.0, fraction)) if math.isfinite(fraction) else 0.0
    summary = (f"moco-ref {__version__} graded {name} (style {report.style}): "
               f"{points_str(earned)}/{points_str(most)} points")
    if len(shown) < len(listed):
        summary += (f"\n{len(listed) - len(shown)} check(s) the course shows later or keeps "
                    "hidden are left out, and not counted in this score.")
    if report.notes:
        summary += "\n" + "\n".join(f"note: {' '.join(student_text(n, root).split())}"
                                    for n in report.notes)
    return {
        "gradable": True,
        "score": round(fraction, 6),
        "message": summary,
        "output": output,
        "tests": tests,
    }


def _images(result: CheckResult, budget: list[int]) -> list[dict]:
    """The figures of a check that did not pass (``report.figures``; none without matplotlib
    or evidence), as PrairieLearn's ``images`` while ``budget[0]`` bytes are left."""
    if result.status is Status.PASSED:
        return []
    from moco_ref.report import figures

    try:
        drawn = figures.check_figures(result.details) if figures.wants_figure(
            result.details) else []
    except Exception:  # noqa: BLE001 - a figure is a bonus: the results go without it
        return []
    images = []
    for caption, png in drawn:
        url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        if len(url) + len(caption) > budget[0]:
            break
        budget[0] -= len(url) + len(caption)
        images.append({"label": caption, "url": url})
    return images


def prairielearn_problems(data) -> list[str]:
    """What makes ``data`` no valid PrairieLearn external-grading results (one line each; []
    when valid): its JSON schema, the 1 MB limit, and no test above its ``max_points``.
    Needs ``jsonschema``."""
    problems = schema_problems(data, SCHEMA_PATH)
    size = len(json.dumps(data, ensure_ascii=False).encode("utf-8"))
    if size > MAX_BYTES:
        problems.append(f"(top level): {size} bytes, over PrairieLearn's "
                        f"{MAX_BYTES} byte limit")
    tests = data.get("tests") if isinstance(data, dict) else None
    for index, test in enumerate(tests if isinstance(tests, list) else []):
        if not isinstance(test, dict):
            continue
        points, most = test.get("points"), test.get("max_points")
        if (isinstance(points, int | float) and isinstance(most, int | float)
                and points > most + 1e-9):
            problems.append(f"tests/{index}: points {points:g} above max_points {most:g}")
    return problems


WRITER = Writer("prairielearn", "PrairieLearn's external-grader results (student-safe)",
                ".prairielearn.json",
                lambda view, writing: dumps_strict(results_of(view)), showing=SHOWING)
