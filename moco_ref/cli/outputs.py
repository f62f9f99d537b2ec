"""Which writers a command runs (``moco_ref.report.writers``; the table is
``moco_ref.platforms.writers()``), from its flags: ``--write NAME[=FILE]`` names any writer of
the table; ``--junit``, ``--gradescope``, ``--prairielearn`` and ``--feedback html|md``
(``--feedback-out``) are shorthands for the writers they name.

Where the files go: with FILE, one file (several submissions in one file only for a format that
holds several, such as JUnit); without FILE, one file per submission — in batch grading beside
its report in ``--out``, otherwise in the current folder, named after the submission
(``alice.py`` → ``alice.gradescope.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moco_ref.report.writers import Writer, Writing

SHORTHANDS = ("junit", "gradescope", "prairielearn")  # flags named as the writer they add


@dataclass(frozen=True)
class Request:
    writer: Writer
    path: str | None = None  # None: one file per submission


def add_output_flags(group, table: dict[str, Writer]) -> None:
    group.add_argument(
        "--write", action="append", default=[], metavar="NAME[=FILE]",
        help="also write this output (repeatable): " + "; ".join(
            f"{name}: {writer.summary}" for name, writer in table.items())
        + ". With =FILE one file, else one file per submission (in --out when grading in "
          "batch, otherwise in the current folder)")
    group.add_argument(
        "--junit", metavar="FILE", nargs="?", const="",
        help="also write JUnit XML: to FILE (all submissions), or without FILE one file per "
        "submission (--write junit)")
    group.add_argument(
        "--prairielearn", metavar="FILE", nargs="?", const="",
        help="also write PrairieLearn external-grader results (--write prairielearn)")
    group.add_argument(
        "--gradescope", metavar="FILE", nargs="?", const="",
        help="also write Gradescope results.json: to FILE (one submission), or without FILE "
        "one file per submission (--write gradescope)")
    group.add_argument(
        "--feedback", choices=("html", "md"),
        help="also write a feedback page per student (score, each family's verdict and "
        "evidence, figures; student-safe, self-contained): in batch grading "
        "<name>.feedback.html/.md beside each report in --out, otherwise "
        "<submission stem>.feedback.html/.md in the current folder (or --feedback-out)")
    group.add_argument("--feedback-out", metavar="FILE",
                       help="where the one submission's --feedback page goes")


def requests_of(args, table: dict[str, Writer]) -> list[Request]:
    """The writers the flags ask for, in the order given; ``ValueError`` (one line) for a name
    the table does not hold."""
    requests = []
    for item in args.write:
        name, _, path = item.partition("=")
        if name not in table:
            raise ValueError(f"--write {name}: no such output (outputs: {', '.join(table)})")
        requests.append(Request(table[name], path or None))
    for name in SHORTHANDS:
        value = getattr(args, name)
        if value is not None:
            requests.append(Request(table[name], value or None))
    if args.feedback_out and not args.feedback:
        raise ValueError("--feedback-out names the page of a submission graded with "
                         "--feedback html|md")
    if args.feedback:
        requests.append(Request(table[f"feedback-{args.feedback}"], args.feedback_out))
    return requests


def file_problem(requests: list[Request], count: int, *, batch: bool) -> str:
    """Why these requests cannot write ``count`` submissions' files ("" when they can)."""
    for request in requests:
        if request.path is None or request.writer.render_reports is not None:
            continue
        if batch:
            return (f"in batch grading {request.writer.name} takes no FILE: one file per "
                    "submission goes into --out")
        if count != 1:
            return (f"{request.writer.name} writes one submission per file; got {count} "
                    "submissions: give no FILE (one file each) or one submission")
    return ""


def write_requested(requests: list[Request], reports, writing: Writing) -> list[tuple[str, Path]]:
    """Write what ``requests`` ask for: a FILE once (all ``reports`` in it), else one file per
    report in the current folder. Returns (what, path) for each file written."""
    written = []
    for request in requests:
        writer = request.writer
        if request.path is not None:
            path = Path(request.path)
            text = (writer.render(reports[0], writing) if writer.render_reports is None
                    else writer.render_batch(reports, writing))
            _write(path, text)
            written.append((writer.name, path))
        else:
            for report in reports:
                path = Path(writer.own_name(report))
                _write(path, writer.render(report, writing))
                written.append((f"{writer.name} for {Path(report.submission).name}", path))
    return written


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
