"""Verdicts out for the grader: a terminal table (``rich`` when importable, plain text
otherwise), JSON and JUnit XML for CI. (Students get theirs through ``moco_ref.report.lms``
and ``moco_ref.report.feedback``.)"""

from __future__ import annotations

import re
import sys
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


# --------------------------------------------------------------------------- terminal


def reason_line(result: CheckResult, width: int = REASON_WIDTH) -> str:
    """The first line of a not-passed check's message, cut to ``width`` characters."""
    if result.status is Status.PASSED or not result.message:
        return ""
    first = result.message.strip().splitlines()[0] if result.message.strip() else ""
    return first if len(first) <= width else first[: width - 1] + "…"


def render_text(reports: list[SubmissionReport], options: GradeOptions | None = None, *,
                brief: bool = False) -> str:
    """The plain-text table (also what is printed when ``rich`` is missing); ``brief``: one
    line per check, the reason cut to one line."""
    out: list[str] = []
    for report in reports:
        head = header_lines(report)
        out.append(f"== {head[0]}")
        out += [f"   {line}" for line in head[1:]]
        if not report.gradable:
            out += [f"   | {line}" for line in report.traceback.rstrip().splitlines()]
        width = max((len(r.check_id) for r in report.results), default=0)
        for result in report.results:
            out.append(
                f"   {result.status.value.upper():<15}{points_text(result):>8}  "
                f"{result.check_id:<{width}}  {result.title}"
            )
            if result.message and result.status is not Status.PASSED:
                pad = " " * (3 + 15 + 8 + 2)
                lines = [reason_line(result)] if brief else result.message.splitlines()
                out += [f"{pad}{line}" for line in lines]
        out += [f"   rerun: {command}" for command in rerun_lines(report, options)]
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
    """Per submission: its header, a summary table (check, points, status, one-line reason)
    and — unless ``brief`` — the details of every check not passed, at full width."""
    file = file or sys.stdout
    if use_rich is None:
        use_rich = _rich_available()
    if not use_rich:
        file.write(render_text(reports, options, brief=brief) + "\n")
    else:
        _print_rich(reports, options, file, brief=brief)
    unconfined = sorted({r.isolation for r in reports if r.isolation.startswith("processes")})
    for isolation in unconfined:
        file.write(f"isolation: {isolation}\n")


def _rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _print_rich(reports, options, file, *, brief: bool = False) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(file=file, highlight=False)
    if not console.is_terminal:
        console = Console(file=file, highlight=False, width=120)
    for report in reports:
        head = header_lines(report)
        console.rule(Text(head[0], style="bold"), align="left")
        for line in head[1:]:
            console.print(Text(line), soft_wrap=True)  # Text: never read as markup
        if not report.gradable:
            console.print(Text(report.traceback.rstrip(), style="red"))
        if report.results:
            console.print(_rich_table(report))
        if not brief:
            for result in report.results:
                if detailed(result) and result.message:
                    console.print(Text(f"{result.check_id} — {result.status.value}",
                                       style=_STATUS_STYLES[result.status]))
                    console.print(Text(result.message.rstrip()), soft_wrap=True)
                    console.print(Text("rerun: ", style="dim") + Text(
                        rerun_command(report.submission, result.check_id, options)),
                        soft_wrap=True)
                    console.print()
        else:
            for command in rerun_lines(report, options):
                console.print(Text("rerun: ", style="dim") + Text(command), soft_wrap=True)
        console.print()


def _rich_table(report: SubmissionReport):
    """check, points, status and the one-line reason; titles wrap, the rest does not."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, expand=True)
    table.add_column("check", no_wrap=True)
    table.add_column("points", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("reason", overflow="ellipsis", no_wrap=True, ratio=1)  # takes what is left
    for result in report.results:
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
            case.set("time", "0")
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
