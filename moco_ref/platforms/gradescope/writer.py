"""Gradescope's autograder ``results.json`` for one submission, written for the student who
handed it in (never a path of the grading machine, a local command, or the submission's own
output unless the rubric says so) from ``StudentView`` with Gradescope's ``SHOWING``.

Gradescope (its documented semantics: a test's ``visibility`` says when the student sees it,
``hidden`` never, ``after_due_date`` once the (late) due date has passed, ``after_published``
once the grades are published; while tests are hidden the student does not see the total
``score``). Every check is a test with its rubric visibility, its output in full: Gradescope
holds it back. The top-level ``output`` is always shown, so while any check is not ``visible``
it does not state the total: it gives the points of the visible checks (the sum of what the
visible tests show), names only visible checks, and leaves out the inferred values of a
withheld check's family; ``score`` stays the true total (Gradescope's gradebook needs it and
hides it itself), ``visibility`` stays ``visible`` (every test has its own), and
``stdout_visibility`` is ``visible`` only when the rubric shows the submission's output and
every check is visible (the autograder's own stdout states the total). ``extra_data`` carries
the same inferred values as the output. ``Rubric.released`` is not used: Gradescope releases.

Gradescope's text is Markdown (``output_format: "md"``); what the submission or a check wrote
goes into fenced code blocks, so it is shown as written and never read as Markdown or HTML
(the student-safe text is ``moco_ref.report.text``'s).
``gradescope_problems`` checks a results dict against the JSON schema of Gradescope's format
(``results.schema.json`` beside this module).
"""

from __future__ import annotations

import math
from pathlib import Path

from moco_ref import __version__
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC, Rubric
from moco_ref.platforms.results import numbered, points, schema_problems
from moco_ref.probe.options import GradeOptions
from moco_ref.report.scoring import points_str
from moco_ref.report.student_view import Showing, StudentView
from moco_ref.report.text import (
    code_span,
    dumps_strict,
    fence,
    inferred_text,
    md_escape,
    one_line_reason,
    shown_name,
    student_text,
    submission_folder,
    submission_name,
)
from moco_ref.report.writers import Writer

SCHEMA_PATH = Path(__file__).with_name("results.schema.json")
NOT_GRADABLE_TEST = "submission loads and runs"
# Gradescope receives every test with its visibility, releases each itself, and hides the
# total from students while a test is withheld
SHOWING = Showing("gradescope", releases_itself=True, hides_total_while_withheld=True)
_STATUS_LEAD = {
    Status.FAILED: "**Failed.**",
    Status.ERROR: "**Error:** the check could not run.",
    Status.TIMEOUT: "**Timed out:** this part of the submission ran out of time.",
}


def _gradescope_test_output(result: CheckResult, root: Path | None) -> str:
    message = student_text(result.message, root).strip()
    if result.status is Status.PASSED:
        return fence(message) if message else ""
    if result.status is Status.NOT_JUDGED:
        reason = one_line_reason(message) or "not judged"
        return f"**Not judged:** {md_escape(reason)}"
    lead = _STATUS_LEAD.get(result.status, f"**{result.status.value}.**")
    return f"{lead}\n\n{fence(message)}" if message else lead


def _summary_markdown(view: StudentView, root: Path | None) -> str:
    report, rubric = view.report, view.rubric
    name = code_span(shown_name(submission_name(report, root)))
    lines = []
    if report.gradable and view.complete:
        lines.append(f"moco-ref {__version__} graded {name} (style {md_escape(report.style)}): "
                     f"**{points_str(report.score)} / {points_str(report.max_score)}** points.")
    elif report.gradable:
        lines.append(f"moco-ref {__version__} graded {name} (style {md_escape(report.style)}): "
                     f"**{points_str(view.shown_score)} / {points_str(view.shown_max_score)}** "
                     "points from the checks shown now. Other checks count towards the total; "
                     "the course shows them, and the total, later.")
    else:
        lines.append(f"moco-ref {__version__} could not grade {name}: "
                     f"{md_escape(one_line_reason(student_text(report.traceback, root)))}")
    if view.inferred:
        lines += ["", f"Inferred from the submission: {md_escape(inferred_text(view.inferred))}."]
    if report.notes:
        lines += ["", "Notes:"]
        lines += [f"- {md_escape(' '.join(student_text(note, root).split()))}"
                  for note in report.notes]
    not_applicable = view.not_applicable
    if not_applicable:
        lines += ["", f"Not applicable to style {md_escape(report.style)} (not counted): "
                  + ", ".join(code_span(check) for check in not_applicable) + "."]
    if rubric.show_submission_output:
        for title, text in (("Your submission's output", report.stdout),
                            ("Your submission's error output", report.stderr)):
            text = student_text(text, root)
            if text.strip():
                lines += ["", f"**{title}:**", "", fence(text)]
    return "\n".join(lines)


def gradescope_results(
    report: SubmissionReport,
    options: GradeOptions | None = None,
    rubric: Rubric | None = None,
    *,
    submission_root: Path | str | None = None,
) -> dict:
    """Gradescope's autograder ``results.json`` for ``report`` (Markdown, student-safe).

    One test per check that applies to the style (``number`` family.index, ``tags`` [family,
    status], ``visibility`` from the rubric); a check not judged fails with its one-line
    reason. A submission that is not gradable gets a single failed test with the reason and
    score 0. ``options`` is accepted for compatibility (the results name no command)."""
    del options  # nothing of the options is shown to students
    return results_of(StudentView(report, rubric or DEFAULT_RUBRIC, SHOWING),
                      submission_root=submission_root)


def results_of(view: StudentView, *, submission_root: Path | str | None = None) -> dict:
    """``results.json`` from the student's view on Gradescope (``gradescope_results``)."""
    report, rubric = view.report, view.rubric
    root = Path(submission_root) if submission_root is not None else submission_folder(report)
    results = view.listed
    tests = []
    for result, number in zip(results, numbered(results, rubric.visibility_of),
                              strict=True):
        seen = view.seen(result)  # as read when Gradescope shows this test
        tests.append({
            "name": f"{result.check_id}: {result.title}",
            "number": number,
            "score": points(seen.points),
            "max_score": points(seen.max_points),
            "status": "passed" if result.status is Status.PASSED else "failed",
            "output": _gradescope_test_output(seen, root),
            "output_format": "md",
            "visibility": rubric.visibility_of(result.check_id),
            "tags": [result.family, result.status.value],
        })
    if not report.gradable:
        trace = student_text(report.traceback, root).strip() or "the submission could not run"
        reason = one_line_reason(trace)
        output = f"**Not gradable:** {md_escape(reason)}"
        if trace != reason:
            output += "\n\n" + fence(trace)
        tests.append({
            "name": NOT_GRADABLE_TEST,
            "number": "load.1",
            "score": 0.0,
            "max_score": points(max(report.max_score, rubric.total)),
            "status": "failed",
            "output": output,
            "output_format": "md",
            "visibility": "visible",
            "tags": ["load", "not gradable"],
        })
    return {
        "score": points(report.score) if report.gradable else 0.0,
        "execution_time": max(0, math.ceil(report.wall_seconds)),
        "output": _summary_markdown(view, root),
        "output_format": "md",
        "test_output_format": "md",
        "visibility": "visible",
        "stdout_visibility": ("visible" if rubric.show_submission_output and view.complete
                              else "hidden"),
        "extra_data": {
            "moco_ref_version": __version__,
            "style": report.style,
            "gradable": report.gradable,
            "inferred": view.inferred,
        },
        "tests": tests,
    }


def gradescope_problems(data) -> list[str]:
    """What makes ``data`` no valid Gradescope results (one line each; [] when valid).
    Needs ``jsonschema`` (installed with nbformat)."""
    return schema_problems(data, SCHEMA_PATH)


WRITER = Writer("gradescope", "Gradescope's autograder results.json (student-safe)",
                ".gradescope.json",
                lambda view, writing: dumps_strict(results_of(view)), showing=SHOWING)
