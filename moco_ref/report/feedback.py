"""A feedback page per student: a self-contained HTML page or a Markdown file.

What it shows: the score against the rubric, each invariant family's verdict with its checks'
evidence (their messages), and a figure wherever the check's machine-readable evidence
(``CheckResult.details``, see ``moco_ref.report.figures``) draws one: the loss per step, the
queue's contents, the EMA, the mask. Figures are PNGs inlined as ``data:`` URIs: the page
needs no network, no external file and no script. Without matplotlib the page has no figures
and says so.

Written for the student, like the Gradescope results (``moco_ref.platforms``), with the
same student-safe text (``moco_ref.report.text``): the submission's file name only, no path
of the grading machine, no local command; the rubric's ``[visibility]`` is respected
(``Rubric.shown_now``): nothing on the page carries the outcome, points, evidence or
misconception of a check that is not shown now, the inferred values included
(``text.student_inferred``).

- A ``visible`` check is shown in full.
- An ``after_due_date`` or ``after_published`` check is named, with when it is shown, and
  nothing more, until the teacher releases it (``moco-ref grade --feedback … --release-feedback``,
  ``Rubric.released``): then it is shown in full, its visibility named.
- A ``hidden`` check is left out; the page says how many there are.
- The total score is shown when every check is shown, or once the teacher has released the
  results (like Gradescope's total, which appears when the grades are published); before that
  the page gives the points of the checks shown, so no withheld check's outcome can be
  worked out from it.
"""

from __future__ import annotations

import base64
import html

from moco_ref import __version__
from moco_ref.judge.registry import FAMILIES, FAMILY_TITLES
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC, Rubric
from moco_ref.report import figures
from moco_ref.report.scoring import points_str, told_elsewhere
from moco_ref.report.student_view import PAGE, StudentView
from moco_ref.report.text import (
    code_span,
    fence,
    inferred_text,
    md_escape,
    one_line_reason,
    shown_name,
    student_text,
    submission_folder,
    submission_name,
)

KINDS = ("html", "md")
VISIBILITY_NOTES = {
    "after_due_date": "shown after the due date",
    "after_published": "shown after the grades are published",
}
NO_FIGURES = ("Figures are not drawn here: matplotlib is not installed where this was graded "
              "(the evidence is in the text).")
_VERDICTS = {Status.PASSED: "passed", Status.FAILED: "failed", Status.ERROR: "error",
             Status.TIMEOUT: "timed out", Status.NOT_JUDGED: "not judged"}


class _Page:
    """The feedback's content, independent of HTML or Markdown."""

    def __init__(self, view: StudentView, *, draw: bool = True) -> None:
        report, rubric = view.report, view.rubric
        self.report = report
        self.rubric = rubric
        self.root = submission_folder(report)
        self.name = shown_name(submission_name(report, self.root))
        self.draw = draw and figures.available()
        self.shown, self.hidden, self.later = view.shown, view.hidden, view.later
        self.not_applicable = view.not_applicable
        self.total_shown = rubric.released or view.complete  # released: the grades are out
        self.inferred = view.inferred
        self.view = view

    def text(self, value: str) -> str:
        return student_text(value, self.root).strip()

    @property
    def score(self) -> str:
        return points_str(self.report.score) if self.report.gradable else "0"

    @property
    def max_score(self) -> str:
        return points_str(self.report.max_score)

    @property
    def shown_score(self) -> str:
        return points_str(self.view.shown_score)

    @property
    def shown_max_score(self) -> str:
        return points_str(self.view.shown_max_score)

    def later_text(self) -> str:
        """``the loss (shown after the due date), …``: the checks shown later, by title."""
        return ", ".join(f"{r.title} ({self.visibility_note(r)})" for r in self.later)

    def families(self) -> list[tuple[str, list[CheckResult]]]:
        order = {family: i for i, family in enumerate(FAMILIES)}
        names = sorted({r.family for r in self.shown}, key=lambda f: order.get(f, len(order)))
        return [(family, [r for r in self.shown if r.family == family]) for family in names]

    def family_verdict(self, results: list[CheckResult]) -> str:
        if all(r.status is Status.PASSED for r in results):
            # a family with a check shown later (named on the page) has not passed yet
            later = any(r.family == results[0].family for r in self.later) if results else False
            return "passed so far" if later else "passed"
        if any(r.status is Status.FAILED for r in results):
            return "broken"
        return "not fully judged"

    def figures_of(self, result: CheckResult) -> list[tuple[str, bytes]]:
        if not self.draw or result.status is Status.PASSED:
            return []
        try:
            return figures.check_figures(result.details)
        except Exception:  # a figure is a bonus: the page is written without it
            return []

    def missing_figure(self, result: CheckResult) -> bool:
        return (not self.draw and result.status is not Status.PASSED
                and figures.wants_figure(result.details))

    def notes_needed(self) -> bool:
        """Whether a figure is left out for want of matplotlib."""
        return not self.draw and any(self.missing_figure(r) for r in self.shown)

    def message(self, result: CheckResult) -> str:
        message = self.text(result.message)
        if result.status is Status.NOT_JUDGED or told_elsewhere(result):
            return one_line_reason(message) or "not judged"
        return message

    def visibility_note(self, result: CheckResult) -> str:
        visibility = self.rubric.visibility_of(result.check_id)
        return VISIBILITY_NOTES.get(visibility, "" if visibility == "visible" else visibility)


_HIDDEN_POINTS = {True: "their points are in the score",
                  False: "they count towards your total"}


def _points(result: CheckResult) -> str:
    return f"{points_str(result.points)} / {points_str(result.max_points)}"


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #111;
       max-width: 52rem; margin: 2rem auto; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
h3 { font-size: 1rem; margin-bottom: .3rem; }
.score { font-size: 1.3rem; font-weight: 600; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .25rem .5rem; border-bottom: 1px solid #ddd; }
td.points { text-align: right; white-space: nowrap; }
.verdict { font-weight: 600; }
.passed::before, .passed-so-far::before { content: "✓ "; }
.broken::before, .failed::before { content: "✗ "; }
.error::before, .timeout::before, .not-judged::before, .not-fully-judged::before
  { content: "? "; }
pre { background: #f4f4f4; padding: .6rem; white-space: pre-wrap; overflow-wrap: anywhere; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption, .note { color: #555; font-size: .9rem; }
"""


def _css_class(verdict: str) -> str:
    return verdict.replace(" ", "-")


def page_view(subject: SubmissionReport | StudentView, rubric: Rubric | None = None
              ) -> StudentView:
    """What the student sees on a page: ``subject`` when it is a view already."""
    if isinstance(subject, StudentView):
        return subject
    return StudentView(subject, rubric or DEFAULT_RUBRIC, PAGE)


def feedback_html(subject: SubmissionReport | StudentView, rubric: Rubric | None = None, *,
                  draw: bool = True) -> str:
    """The self-contained HTML feedback page of a report (or of a student's view of it)."""
    page = _Page(page_view(subject, rubric), draw=draw)
    report = page.report
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>Feedback: {e(page.name)}</title>", f"<style>{_CSS}</style>", "</head>",
           "<body>", f"<h1>Feedback on <code>{e(page.name)}</code></h1>"]
    if report.gradable and page.total_shown:
        out.append(f'<p class="score" data-score="{page.score}" '
                   f'data-max-score="{page.max_score}">Score: {page.score} / {page.max_score}'
                   "</p>")
    elif report.gradable:
        out.append(f'<p class="score" data-score="{page.shown_score}" '
                   f'data-max-score="{page.shown_max_score}" data-total="withheld">'
                   f"Points of the checks shown now: {page.shown_score} / "
                   f"{page.shown_max_score}</p>")
        out.append('<p class="note">Other checks count towards your total; the course shows '
                   "them, and the total, later.</p>")
    if report.gradable:
        out.append(f'<p class="note">Graded as a {e(report.style)} submission by moco-ref '
                   f"{e(__version__)}, against the course's rubric.</p>")
    else:
        reason = one_line_reason(page.text(report.traceback)) or "the submission could not run"
        out.append(f'<p class="score" data-score="0" data-max-score="{page.max_score}">'
                   "Not gradable: score 0</p>")
        out.append(f"<p>Your submission could not be graded: {e(reason)}</p>")
        trace = page.text(report.traceback)
        if trace and trace != reason:
            out.append(f"<pre>{e(trace)}</pre>")
    if page.inferred:
        out.append(f"<p>Inferred from your code: {e(inferred_text(page.inferred))}.</p>")
    for note in report.notes:
        out.append(f'<p class="note">Note: {e(" ".join(page.text(note).split()))}</p>')
    if page.notes_needed():
        out.append(f'<p class="note" id="no-figures">{e(NO_FIGURES)}</p>')
    families = page.families()
    if families:
        out += ["<h2>By invariant family</h2>", "<table>",
                "<tr><th>family</th><th>verdict</th><th>points</th></tr>"]
        for family, results in families:
            verdict = page.family_verdict(results)
            earned = sum(r.points for r in results)
            maximum = sum(r.max_points for r in results)
            title = e(FAMILY_TITLES.get(family, family))
            out.append(f'<tr><td><a href="#family-{e(family)}">{title}</a></td>'
                       f'<td class="verdict {_css_class(verdict)}">{verdict}</td>'
                       f'<td class="points">{points_str(earned)} / {points_str(maximum)}</td></tr>')
        out.append("</table>")
    for family, results in families:
        verdict = page.family_verdict(results)
        out.append(f'<section id="family-{e(family)}"><h2>{e(FAMILY_TITLES.get(family, family))}'
                   f' — <span class="verdict {_css_class(verdict)}">{verdict}</span></h2>')
        for result in results:
            status = _VERDICTS.get(result.status, result.status.value)
            out.append(f'<article class="check" data-check="{e(result.check_id)}">'
                       f'<h3><span class="verdict {_css_class(status)}">{status}</span> '
                       f"{e(result.title)} <small>({e(result.check_id)}, "
                       f"{_points(result)} points)</small></h3>")
            note = page.visibility_note(result)
            if note:
                out.append(f'<p class="note">({e(note)})</p>')
            message = page.message(result)
            if result.status is not Status.PASSED and message:
                out.append(f"<pre>{e(message)}</pre>")
            for caption, png in page.figures_of(result):
                out.append(f'<figure><img src="{_data_uri(png)}" alt="{e(caption)}">'
                           f"<figcaption>{e(caption)}</figcaption></figure>")
            out.append("</article>")
        out.append("</section>")
    out += _html_footer(page)
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


def _html_footer(page: _Page) -> list[str]:
    e = html.escape
    out = []
    if page.later:
        out.append(f'<p class="note" id="shown-later">Shown when the course releases them: '
                   f"{e(page.later_text())}.</p>")
    if page.hidden:
        out.append(f'<p class="note">{len(page.hidden)} check(s) the course keeps hidden are '
                   f"not shown; {_HIDDEN_POINTS[page.total_shown]}.</p>")
    if page.not_applicable:
        out.append(f'<p class="note">Not applicable to a {e(page.report.style)} submission '
                   f"(not counted): {e(', '.join(page.not_applicable))}.</p>")
    if page.rubric.show_submission_output:
        for title, text in (("Your submission's output", page.report.stdout),
                            ("Your submission's error output", page.report.stderr)):
            text = page.text(text)
            if text:
                out += [f"<h2>{title}</h2>", f"<pre>{e(text)}</pre>"]
    return out


# --------------------------------------------------------------------------- Markdown


def feedback_markdown(subject: SubmissionReport | StudentView, rubric: Rubric | None = None,
                      *, draw: bool = True) -> str:
    """The feedback as Markdown (figures as inline ``data:`` images)."""
    page = _Page(page_view(subject, rubric), draw=draw)
    report = page.report
    out = [f"# Feedback on {code_span(page.name)}", ""]
    if report.gradable and page.total_shown:
        out += [f"**Score: {page.score} / {page.max_score}** (graded as a "
                f"{md_escape(report.style)} submission by moco-ref {__version__})", ""]
    elif report.gradable:
        out += [f"**Points of the checks shown now: {page.shown_score} / "
                f"{page.shown_max_score}** (graded as a {md_escape(report.style)} submission "
                f"by moco-ref {__version__}). Other checks count towards your total; the "
                "course shows them, and the total, later.", ""]
    else:
        reason = one_line_reason(page.text(report.traceback)) or "the submission could not run"
        out += ["**Not gradable: score 0**", "", f"Your submission could not be graded: "
                f"{md_escape(reason)}", ""]
    if page.inferred:
        out += [f"Inferred from your code: {md_escape(inferred_text(page.inferred))}.", ""]
    out += [f"Note: {md_escape(' '.join(page.text(note).split()))}" for note in report.notes]
    if page.notes_needed():
        out += ["", f"_{NO_FIGURES}_"]
    families = page.families()
    if families:
        out += ["", "| family | verdict | points |", "|---|---|---|"]
        for family, results in families:
            earned = sum(r.points for r in results)
            maximum = sum(r.max_points for r in results)
            out.append(f"| {md_escape(FAMILY_TITLES.get(family, family))} | "
                       f"{page.family_verdict(results)} | "
                       f"{points_str(earned)} / {points_str(maximum)} |")
    for family, results in families:
        out += ["", f"## {md_escape(FAMILY_TITLES.get(family, family))} — "
                    f"{page.family_verdict(results)}"]
        for result in results:
            status = _VERDICTS.get(result.status, result.status.value)
            out += ["", f"### {status}: {md_escape(result.title)} "
                        f"({md_escape(result.check_id)}, {_points(result)} points)"]
            note = page.visibility_note(result)
            if note:
                out += ["", f"_({note})_"]
            message = page.message(result)
            if result.status is not Status.PASSED and message:
                out += ["", fence(message)]
            for caption, png in page.figures_of(result):
                out += ["", f"![{md_escape(caption)}]({_data_uri(png)})", "",
                        f"_{md_escape(caption)}_"]
    if page.later:
        out += ["", f"Shown when the course releases them: {md_escape(page.later_text())}."]
    if page.hidden:
        out += ["", f"{len(page.hidden)} check(s) the course keeps hidden are not shown; "
                    f"{_HIDDEN_POINTS[page.total_shown]}."]
    if page.not_applicable:
        out += ["", f"Not applicable to a {md_escape(report.style)} submission (not counted): "
                    f"{md_escape(', '.join(page.not_applicable))}."]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- files


def render_feedback(report: SubmissionReport, kind: str, rubric: Rubric | None = None) -> str:
    if kind not in KINDS:
        raise ValueError(f"feedback is html or md, not {kind!r}")
    return (feedback_html if kind == "html" else feedback_markdown)(report, rubric)
