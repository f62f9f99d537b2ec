"""Verdicts for students, through a course's platform: Gradescope's autograder
``results.json`` and PrairieLearn's external-grader results.

Both are written for the student who handed the submission in, not for the grader:

- no path of the grading machine (``/work/…``, ``/tmp/…``, a venv's ``site-packages``) and no
  absolute path of the submission: its files are named relative to the submission's folder;
- no rerun command and no other local command (``moco-ref grade …``);
- the submission's own output only when the rubric says so (``[output]
  show_submission_output``);
- each check shown as the rubric's ``[visibility]`` says (``visible``, ``after_due_date``,
  ``after_published``, ``hidden``), and nothing a student can see now carries the outcome,
  points, evidence or misconception of a check that is not shown now (the inferred values
  included: ``text.student_inferred``).

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

PrairieLearn (no release step: what the results say, the student sees at once). A check is in
``tests[]`` only when ``Rubric.shown_now``: ``hidden`` checks are left out, and
``after_due_date``/``after_published`` ones are treated as hidden until the teacher grades
with ``--release-feedback`` (``Rubric.released``). ``score`` counts only the listed tests:
the points of the checks shown over their maximum (a fraction in [0, 1] consistent with
``tests[]``; 0 when nothing is shown), since a total that counted a left-out check would tell
its outcome. The course's full score is in moco-ref's own reports and gradebook. The message
says how many checks are left out, not what they found.

Gradescope's text is Markdown (``output_format: "md"``); what the submission or a check wrote
goes into fenced code blocks, so it is shown as written and never read as Markdown or HTML
(the student-safe text is ``moco_ref.report.text``'s).
``gradescope_problems`` checks a results dict against the JSON schema of Gradescope's format
(``schemas/gradescope_results.schema.json``), ``prairielearn_problems`` against PrairieLearn's
(``schemas/prairielearn_results.schema.json``, plus its 1 MB limit).
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

from moco_ref import __version__
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC, VISIBILITIES, Rubric
from moco_ref.probe.options import GradeOptions
from moco_ref.report.scoring import points_str
from moco_ref.report.student_view import StudentView
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

GRADESCOPE_SCHEMA_PATH = Path(__file__).with_name("schemas") / "gradescope_results.schema.json"
PRAIRIELEARN_SCHEMA_PATH = (Path(__file__).with_name("schemas")
                            / "prairielearn_results.schema.json")
PRAIRIELEARN_MAX_BYTES = 1_000_000  # PrairieLearn's limit on results.json
IMAGE_BUDGET_BYTES = 600_000  # the figures' share of it (base64 included)
NOT_GRADABLE_TEST = "submission loads and runs"
_STATUS_LEAD = {
    Status.FAILED: "**Failed.**",
    Status.ERROR: "**Error:** the check could not run.",
    Status.TIMEOUT: "**Timed out:** this part of the submission ran out of time.",
}

# --------------------------------------------------------------------------- the checks listed


def _numbers(results: list[CheckResult], visibility_of) -> list[str]:
    """``I4.1``, ``I4.2``, ``contract.1``: the family and the check's place in it, counting
    first the checks a student sees sooner (``VISIBILITIES`` is in that order), so what a
    student sees at any time is numbered 1..n without gaps and no number betrays a test
    withheld from them."""
    order = sorted(range(len(results)), key=lambda i: (
        VISIBILITIES.index(visibility_of(results[i].check_id)), i))
    seen: dict[str, int] = {}
    numbers = [""] * len(results)
    for i in order:
        family = results[i].family
        seen[family] = seen.get(family, 0) + 1
        numbers[i] = f"{family}.{seen[family]}"
    return numbers


def _points(value: float) -> float:
    value = round(float(value), 4) + 0.0
    return value if math.isfinite(value) else 0.0


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
    rubric = rubric or DEFAULT_RUBRIC
    root = Path(submission_root) if submission_root is not None else submission_folder(report)
    view = StudentView(report, rubric, "gradescope")
    results = view.listed
    tests = []
    for result, number in zip(results, _numbers(results, rubric.visibility_of),
                              strict=True):
        seen = view.seen(result)  # as read when Gradescope shows this test
        tests.append({
            "name": f"{result.check_id}: {result.title}",
            "number": number,
            "score": _points(seen.points),
            "max_score": _points(seen.max_points),
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
            "max_score": _points(max(report.max_score, rubric.total)),
            "status": "failed",
            "output": output,
            "output_format": "md",
            "visibility": "visible",
            "tags": ["load", "not gradable"],
        })
    return {
        "score": _points(report.score) if report.gradable else 0.0,
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


def write_gradescope(
    report: SubmissionReport,
    path,
    options: GradeOptions | None = None,
    rubric: Rubric | None = None,
    *,
    submission_root: Path | str | None = None,
) -> None:
    data = gradescope_results(report, options, rubric, submission_root=submission_root)
    Path(path).write_text(dumps_strict(data), encoding="utf-8")


def gradescope_schema() -> dict:
    return json.loads(GRADESCOPE_SCHEMA_PATH.read_text(encoding="utf-8"))


def _schema_problems(data, schema: dict) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for error in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        problems.append(f"{where}: {error.message}")
    return problems


def gradescope_problems(data) -> list[str]:
    """What makes ``data`` no valid Gradescope results (one line each; [] when valid).
    Needs ``jsonschema`` (installed with nbformat)."""
    return _schema_problems(data, gradescope_schema())


# --------------------------------------------------------------------------- PrairieLearn



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
    rubric = rubric or DEFAULT_RUBRIC
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
    view = StudentView(report, rubric, "prairielearn")
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
            "points": _points(result.points),
            "max_points": _points(result.max_points),
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


def write_prairielearn(
    report: SubmissionReport,
    path,
    rubric: Rubric | None = None,
    *,
    submission_root: Path | str | None = None,
) -> None:
    data = prairielearn_results(report, rubric, submission_root=submission_root)
    Path(path).write_text(dumps_strict(data), encoding="utf-8")


def prairielearn_schema() -> dict:
    return json.loads(PRAIRIELEARN_SCHEMA_PATH.read_text(encoding="utf-8"))


def prairielearn_problems(data) -> list[str]:
    """What makes ``data`` no valid PrairieLearn external-grading results (one line each; []
    when valid): its JSON schema, the 1 MB limit, and no test above its ``max_points``.
    Needs ``jsonschema``."""
    problems = _schema_problems(data, prairielearn_schema())
    size = len(json.dumps(data, ensure_ascii=False).encode("utf-8"))
    if size > PRAIRIELEARN_MAX_BYTES:
        problems.append(f"(top level): {size} bytes, over PrairieLearn's "
                        f"{PRAIRIELEARN_MAX_BYTES} byte limit")
    tests = data.get("tests") if isinstance(data, dict) else None
    for index, test in enumerate(tests if isinstance(tests, list) else []):
        if not isinstance(test, dict):
            continue
        points, most = test.get("points"), test.get("max_points")
        if (isinstance(points, int | float) and isinstance(most, int | float)
                and points > most + 1e-9):
            problems.append(f"tests/{index}: points {points:g} above max_points {most:g}")
    return problems
