"""The outputs moco-ref writes, as a table of writers: each renders one report — from the staff's
view (the whole report) or from a student's view (``StudentView``: what that surface may show)
— and, where its format has one, a batch of reports in one file.

``grade``, batch grading, ``demo`` and the pytest plugin take a list of writers; the command
line names them (``grade --write NAME[=FILE]``; ``--json``, ``--junit``, ``--gradescope``,
``--prairielearn`` and ``--feedback`` are shorthands). A new output is one ``Writer`` added to
``REPORT_WRITERS`` here, or a learning platform's package (``moco_ref.platforms``) that brings
its own.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moco_ref.judge.results import SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC, Rubric
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.source import SUBMISSION_SUFFIXES
from moco_ref.report.student_view import PAGE, Showing, StudentView


@dataclass(frozen=True)
class Writing:
    """What every writer may use beside the report."""

    options: GradeOptions
    rubric: Rubric = DEFAULT_RUBRIC


@dataclass(frozen=True)
class Writer:
    """One output format."""

    name: str  # what a user names: grade --write NAME
    summary: str  # one line for --help
    suffix: str  # a report's file is <stem><suffix>
    # the file's text from the subject: the report for the staff, the StudentView otherwise
    render_subject: Callable[[Any, Writing], str]
    showing: Showing | None = None  # None: the staff's output (the whole report)
    render_reports: Callable[[list[SubmissionReport], Writing], str] | None = None
    named_for_students: bool = False  # in a batch folder: named by the students, not the file

    @property
    def audience(self) -> str:
        return "staff" if self.showing is None else "student"

    def own_name(self, report: SubmissionReport) -> str:
        """The file of ``report`` named after its submission: ``alice.py`` →
        ``alice<suffix>`` (a module path: its last part)."""
        name = Path(report.submission).name
        stem = (name.rsplit(".", 1)[0] if name.endswith(SUBMISSION_SUFFIXES)
                else name.split(".")[-1])
        return f"{stem}{self.suffix}"

    def render(self, report: SubmissionReport, writing: Writing) -> str:
        """The file of one report; a student writer is handed the student's view only."""
        if self.showing is None:
            return self.render_subject(report, writing)
        return self.render_subject(StudentView(report, writing.rubric, self.showing), writing)

    def render_batch(self, reports: list[SubmissionReport], writing: Writing) -> str:
        """One file of several reports (``render_reports``); ``ValueError`` when the format
        holds one report per file."""
        if self.render_reports is None:
            raise ValueError(f"{self.name} writes one submission per file")
        return self.render_reports(reports, writing)


# --------------------------------------------------------------------------- the writers


def _json(reports: list[SubmissionReport], writing: Writing) -> str:
    from moco_ref.report.formats import to_json

    return to_json(reports, writing.options)


def _junit(reports: list[SubmissionReport], writing: Writing) -> str:
    import xml.etree.ElementTree as ET

    from moco_ref.report.formats import junit_tree

    tree = junit_tree(reports, writing.options)
    ET.indent(tree)
    buffer = io.BytesIO()
    tree.write(buffer, encoding="utf-8", xml_declaration=True)
    return buffer.getvalue().decode("utf-8")


def _text(reports: list[SubmissionReport], writing: Writing) -> str:
    from moco_ref.report.formats import render_text

    return render_text(reports, writing.options)


def _feedback(kind: str) -> Callable[[StudentView, Writing], str]:
    def render(view: StudentView, writing: Writing) -> str:
        from moco_ref.report.feedback import feedback_html, feedback_markdown

        return (feedback_html if kind == "html" else feedback_markdown)(view)

    return render


REPORT_WRITERS: dict[str, Writer] = {writer.name: writer for writer in (
    Writer("json", "the whole report as JSON (moco-ref's own format)", ".json",
           lambda report, writing: _json([report], writing), render_reports=_json),
    Writer("junit", "JUnit XML: one test case per check, for CI dashboards", ".junit.xml",
           lambda report, writing: _junit([report], writing), render_reports=_junit),
    Writer("text", "the terminal report as plain text", ".txt",
           lambda report, writing: _text([report], writing), render_reports=_text),
    Writer("feedback-html", "the student's feedback page (HTML, self-contained)",
           ".feedback.html", _feedback("html"), showing=PAGE, named_for_students=True),
    Writer("feedback-md", "the student's feedback page (Markdown)", ".feedback.md",
           _feedback("md"), showing=PAGE, named_for_students=True),
)}
