"""Verdicts out for the grader: a terminal table (``rich`` when importable, plain text
otherwise), JSON and JUnit XML for CI. (Students get theirs through their platform's package,
``moco_ref.platforms``, and ``moco_ref.report.feedback``; the table of outputs is
``moco_ref.report.writers``.)"""

from __future__ import annotations

import os
import re
import shlex
import sys
import textwrap
import xml.etree.ElementTree as ET

from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.probe.options import GradeOptions
from moco_ref.report.scoring import NOT_PASSED, points_str, rerun_command, told_elsewhere
from moco_ref.report.text import dumps_strict, inferred_text, shown_name

JSON_FORMAT = "moco-ref-grade/1"
_STATUS_STYLES = {
    Status.PASSED: "green",
    Status.FAILED: "bold red",
    Status.ERROR: "magenta",
    Status.TIMEOUT: "yellow",
    Status.NOT_JUDGED: "cyan",
    Status.NOT_APPLICABLE: "dim",
}


# --------------------------------------------------------------------------- shared wording


REASON_WIDTH = 100  # the one-line reason (the terminal table cuts it to what fits)
TERMINAL_WIDTH = 80  # the report's width when it is not printed to a terminal (README)


def report_width() -> int:
    """The width of a report that is not printed to a terminal (piped, to a file): 80
    columns, unless ``COLUMNS`` says otherwise."""
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else TERMINAL_WIDTH


def report_console(file=None):
    """A rich console for a report: the terminal's width on a terminal, ``report_width``
    otherwise (rich would take the width of the terminal the pipe starts from)."""
    from rich.console import Console

    console = Console(file=file, highlight=False)
    if console.is_terminal:
        return console
    return Console(file=file, highlight=False, width=report_width())


def score_text(report: SubmissionReport) -> str:
    if not report.gradable:
        return "not gradable"
    return f"{points_str(report.score)}/{points_str(report.max_score)}"


def points_text(result: CheckResult) -> str:
    if result.status is Status.NOT_APPLICABLE:
        return "–"
    return f"{points_str(result.points)}/{points_str(result.max_points)}"


def header_lines(report: SubmissionReport) -> list[str]:
    verdict = f"score {score_text(report)}" if report.gradable else "NOT GRADABLE"
    seconds = f"{report.wall_seconds:.1f} s"
    name, style = shown_name(report.submission, cap=4096), shown_name(report.style)
    lines = [f"{name} — style {style} — {verdict} ({seconds})"]
    if report.inferred:
        lines.append(f"inferred: {shown_name(inferred_text(report.inferred), cap=2_000)}")
    lines += [f"note: {shown_name(note, cap=2_000)}" for note in report.notes]
    lines += [f"staff: {shown_name(note, cap=2_000)}" for note in report.staff_notes]
    return lines


def detailed(result: CheckResult) -> bool:
    """Whether a result gets a details section and a rerun command."""
    return result.status in NOT_PASSED and not told_elsewhere(result)


def rerun_lines(report: SubmissionReport, options: GradeOptions | None) -> list[str]:
    return [
        rerun_command(report.submission, result.check_id, options)
        for result in report.results
        if detailed(result)
    ]


def command_lines(command: str, width: int, label: str = "rerun: ") -> list[str]:
    """``label`` + ``command`` on one line when it fits ``width``, else the label alone and
    the command broken between its words with the shell's `` \\`` continuations — still
    one command when pasted (a word longer than the width stays whole)."""
    if len(label) + len(command) <= width:
        return [label + command]
    if len(command) <= width:
        return [label.rstrip(), command]
    lines, line = [label.rstrip()], ""
    for word in shlex.split(command):
        word = shlex.quote(word)
        if line and len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


class Folded:
    """Rows that tell one thing, told once: the checks that do not apply to the style, or
    the checks not run because of one crash (told in full under another check)."""

    def __init__(self, status: Status, message: str, results: list[CheckResult]) -> None:
        self.status, self.message, self.results = status, message, results

    @property
    def count(self) -> str:
        return f"{len(self.results)} check{'s' if len(self.results) != 1 else ''}"

    def text(self) -> str:
        reason = self.message.strip().splitlines()[0] if self.message.strip() else ""
        if self.status is Status.NOT_APPLICABLE:
            return f"not applicable: {self.count}" + (f" ({reason})" if reason else "")
        head, _, rest = reason.partition("not run: ")
        reason = rest if not head and rest else reason
        families = ", ".join(dict.fromkeys(result.family for result in self.results))
        return (f"not run: {self.count} ({families}), worth "
                f"{points_str(sum(r.max_points for r in self.results))} points — {reason}")


def folded_rows(report: SubmissionReport) -> tuple[list[CheckResult], list[Folded]]:
    """The results shown one a row, and the folded groups: every not-applicable check of a
    reason in one group; the checks not run for one crash (``told_elsewhere``, the same
    message) in one group when there are two or more."""
    groups: dict[tuple, list[CheckResult]] = {}
    for result in report.results:
        if result.status is Status.NOT_APPLICABLE:
            groups.setdefault((result.status, result.message), []).append(result)
        elif told_elsewhere(result) and result.message.startswith("not run: "):
            groups.setdefault((result.status, result.message), []).append(result)
    folded = [Folded(status, message, members) for (status, message), members in
              groups.items() if status is Status.NOT_APPLICABLE or len(members) > 1]
    gone = {id(result) for group in folded for result in group.results}
    return [result for result in report.results if id(result) not in gone], folded


# --------------------------------------------------------------------------- terminal


def reason_line(result: CheckResult, width: int = REASON_WIDTH) -> str:
    """The first line of a not-passed check's message, cut to ``width`` characters."""
    if result.status is Status.PASSED or not result.message:
        return ""
    first = result.message.strip().splitlines()[0] if result.message.strip() else ""
    return first if len(first) <= width else first[: width - 1] + "…"


def render_text(reports: list[SubmissionReport], options: GradeOptions | None = None, *,
                brief: bool = False, width: int | None = None) -> str:
    """The plain-text table (also what is printed when ``rich`` is missing), ``width``
    columns wide (default: ``report_width``), each not-passed check's evidence whole and
    wrapped at spaces; ``brief``: one line per check, the reason cut to fit."""
    width = width or report_width()
    out: list[str] = []

    def wrapped(text: str, indent: str, then: str | None = None) -> None:
        for line in text.splitlines() or [""]:
            out.extend(textwrap.wrap(line, width, initial_indent=indent, subsequent_indent=(
                indent if then is None else then), break_on_hyphens=False,
                replace_whitespace=False) or [indent.rstrip()])

    for report in reports:
        head = header_lines(report)
        wrapped(f"== {head[0]}", "")
        for line in head[1:]:
            wrapped(line, "   ")
        if not report.gradable:
            wrapped(report.traceback.rstrip(), "   | ")
        shown, folded = folded_rows(report)
        check_width = max((len(r.check_id) for r in shown), default=0)
        pad = " " * (3 + 15 + 8 + 2)
        for result in shown:
            row = (f"   {result.status.value.upper():<15}{points_text(result):>8}  "
                   f"{result.check_id:<{check_width}}  {result.title}")
            out.append(row if len(row) <= width else row[: width - 1] + "…")
            if result.message and result.status is not Status.PASSED:
                if brief:
                    out.append(pad + reason_line(result, max(10, width - len(pad))))
                else:  # the evidence whole, wrapped at spaces (never cut)
                    wrapped(result.message, pad)
        for group in folded:
            label, _, text = group.text().partition(": ")
            wrapped(f"{label.upper():<15}{'–':>8}  {text}", "   ", pad)
        for command in rerun_lines(report, options):
            out += ["   " + line for line in command_lines(command, width - 3)]
        out.append("")
    return "\n".join(out)


def print_reports(
    reports: list[SubmissionReport],
    options: GradeOptions | None = None,
    *,
    file=None,
    use_rich: bool | None = None,
    brief: bool = False,
) -> None:
    """Per submission: its header, a summary table (check, points, status, one-line reason;
    the checks that do not apply, and those not run because of one crash, folded into a line
    each) and — unless ``brief`` — the details of every check not passed, whole and wrapped
    at spaces. Every line fits the terminal, or ``report_width`` when not printed to one (80
    columns unless ``COLUMNS`` says otherwise); only a rerun command is never broken."""
    file = file or sys.stdout
    if use_rich is None:
        use_rich = _rich_available()
    if not use_rich:
        file.write(render_text(reports, options, brief=brief) + "\n")
    else:
        _print_rich(reports, options, file, brief=brief)
    unconfined = sorted({r.isolation for r in reports if r.isolation.startswith("processes")})
    for isolation in unconfined:
        file.write(textwrap.fill(f"isolation: {isolation}", report_width() if not use_rich
                                 else report_console(file).width, subsequent_indent="  ")
                   + "\n")


def _rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _print_rich(reports, options, file, *, brief: bool = False) -> None:
    from rich.text import Text

    console = report_console(file)

    def rerun(command: str) -> None:
        lines = command_lines(command, console.width)
        console.print(Text("rerun:", style="dim") + Text(lines[0][len("rerun:"):]),
                      soft_wrap=True)
        for line in lines[1:]:  # never wrapped by the console: the command stays pastable
            console.print(Text(line), soft_wrap=True)

    for report in reports:
        head = header_lines(report)
        if len(head[0]) + 2 <= console.width:
            console.rule(Text(head[0], style="bold"), align="left")
        else:  # a rule would cut the name, or the score at its end
            console.print(Text(head[0], style="bold"))
            console.rule()
        for line in head[1:]:
            console.print(Text(line))  # Text: never read as markup
        if not report.gradable:
            console.print(Text(report.traceback.rstrip(), style="red"))
        shown, folded = folded_rows(report)
        if shown:
            console.print(_rich_table(shown))
        for group in folded:
            console.print(Text(group.text(), style=_STATUS_STYLES[group.status]))
        if folded:
            console.print()
        if not brief:
            for result in report.results:
                if detailed(result) and result.message:
                    console.print(Text(f"{result.check_id} — {result.status.value}",
                                       style=_STATUS_STYLES[result.status]))
                    # the evidence whole, wrapped at spaces to the width (never cut)
                    console.print(Text(result.message.rstrip()))
                    rerun(rerun_command(report.submission, result.check_id, options))
                    console.print()
        else:
            for command in rerun_lines(report, options):
                rerun(command)
        console.print()


def _rich_table(results: list[CheckResult]):
    """check, points, status and the one-line reason; the reason takes what is left and
    is cut to it, the rest does not wrap."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, expand=True, pad_edge=False)
    table.add_column("check", no_wrap=True)
    table.add_column("points", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("reason", overflow="ellipsis", no_wrap=True, ratio=1)  # takes what is left
    for result in results:
        table.add_row(
            Text(result.check_id),
            Text(points_text(result)),
            Text(result.status.value, style=_STATUS_STYLES[result.status]),
            Text(reason_line(result) or (result.title if result.status is Status.PASSED
                                         else "")),
        )
    return table


# --------------------------------------------------------------------------- JSON


def to_json(
    reports: list[SubmissionReport], options: GradeOptions | None = None, **extra
) -> str:
    """``{"format", "reports": [SubmissionReport.to_dict() + rerun commands], ...extra}``."""
    payload = {"format": JSON_FORMAT, "reports": [], **extra}
    for report in reports:
        data = report.to_dict()
        for result_data, result in zip(data["results"], report.results, strict=True):
            if result.status in NOT_PASSED:
                result_data["rerun"] = rerun_command(report.submission, result.check_id, options)
        payload["reports"].append(data)
    return dumps_strict(payload)


# --------------------------------------------------------------------------- JUnit XML

_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text) -> str:
    """XML 1.0 cannot hold most control characters (ANSI colours, NULs in student output)."""
    return _XML_ILLEGAL.sub("\ufffd", str(text))


def junit_tree(
    reports: list[SubmissionReport], options: GradeOptions | None = None
) -> ET.ElementTree:
    """One ``<testsuite>`` per submission, one ``<testcase>`` per check: failed → ``<failure>``,
    error/timeout/not judged → ``<error>``, not applicable → ``<skipped>``. A submission that is not
    gradable gets a single errored test case holding the traceback."""
    suites = ET.Element("testsuites", name="moco-ref")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for report in reports:
        suite = ET.SubElement(suites, "testsuite", name=_xml_text(report.submission))
        properties = ET.SubElement(suite, "properties")
        for name, value in (
            ("style", report.style),
            ("score", points_str(report.score)),
            ("max_score", points_str(report.max_score)),
            ("gradable", str(report.gradable).lower()),
            *((f"inferred.{key}", value) for key, value in report.inferred.items()),
            *(("note", note) for note in report.notes),
        ):
            ET.SubElement(properties, "property", name=name, value=_xml_text(value))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        classname = f"moco_ref.{report.style}"
        if not report.gradable:
            case = ET.SubElement(suite, "testcase", classname=classname, name="not-gradable")
            error = ET.SubElement(case, "error", type="not gradable")
            error.set("message", _xml_text(_first_line(report.traceback) or "not gradable"))
            error.text = _xml_text(report.traceback)
            counts["tests"] += 1
            counts["errors"] += 1
        for result in report.results:
            case = ET.SubElement(
                suite, "testcase", classname=classname, name=_xml_text(result.check_id)
            )
            case.set("time", f"{result.seconds:.3f}")  # the grader's time judging it
            counts["tests"] += 1
            body = result.message
            if result.status in NOT_PASSED:
                body += "\nrerun: " + rerun_command(report.submission, result.check_id, options)
            if result.status is Status.FAILED:
                node, counts["failures"] = ET.SubElement(case, "failure"), counts["failures"] + 1
            elif result.status in (Status.ERROR, Status.TIMEOUT, Status.NOT_JUDGED):
                node, counts["errors"] = ET.SubElement(case, "error"), counts["errors"] + 1
            elif result.status is Status.NOT_APPLICABLE:
                node, counts["skipped"] = ET.SubElement(case, "skipped"), counts["skipped"] + 1
            else:
                continue
            node.set("type", result.status.value)
            node.set("message", _xml_text(_first_line(result.message) or result.status.value))
            if result.status is not Status.NOT_APPLICABLE:
                node.text = _xml_text(body)
        ET.SubElement(suite, "system-out").text = _xml_text(report.stdout)
        ET.SubElement(suite, "system-err").text = _xml_text(report.stderr)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", f"{report.wall_seconds:.3f}")
    for key, value in totals.items():
        suites.set(key, str(value))
    return ET.ElementTree(suites)


def write_junit(
    reports: list[SubmissionReport], path, options: GradeOptions | None = None
) -> None:
    tree = junit_tree(reports, options)
    ET.indent(tree)
    tree.write(str(path), encoding="utf-8", xml_declaration=True)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
