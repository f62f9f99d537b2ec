"""Outputs are inert (the threat model): nothing a student names reaches a spreadsheet, a
terminal or Markdown raw.

- CSV: the real writers, with hostile names, read back with ``csv.reader``: no cell begins
  with a formula character; the grader's numbers stay numbers (unquoted);
- terminal: what the printing sites print (batch table, progress lines, the summary, the
  report header, the demo scoreboard, diff-grades, class-report, merge notes, usage errors)
  holds no escape sequence, no carriage return, no bell and starts no forged line;
- Markdown: a name holding backtick runs stays inside its code span, read by a CommonMark
  parser (markdown-it, which rich brings).
"""

from __future__ import annotations

import ast
import csv
import html
import io
import json
import random
import re
from pathlib import Path

import pytest

from moco_ref.cli import main
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.probe.options import GradeOptions
from moco_ref.report import text as safe_text
from moco_ref.report.gradebook_csv import gradebook_csv, summary_csv
from moco_ref.report.text import code_span, csv_cell, fence, shown_name
from moco_ref.run.batch import SUMMARY_FORMAT, BatchResult, Outcome, write_merged, write_summary
from moco_ref.run.targets import Target

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
FORGED = "all 12 submission(s) reach full marks"
# File names (and display names) a student could choose.
TERMINAL_NAMES = (
    "\x1b]0;pwned\x07alice.py",  # an OSC window title
    "bob\x1b[2J\x1b[H.py",  # clear the screen, cursor home
    "carol.py\r[9/9] graded dave.py: 100/100",  # a carriage return overwrites the line
    f"\x1b[32m{FORGED}\x1b[0m.py",  # a forged green summary line
    f"eve.py\n{FORGED}",  # a line of its own
    "frank\u202egnp.py",  # a right-to-left override
    "gina\x9b31mred.py",  # the one-byte (C1) CSI
)
FORMULAS = (
    '=HYPERLINK("http://x","y")',
    "+1+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
    "  =1+1",
    "\x1b[0m=1+1",
    "\uff1d1+1",  # a full-width equals sign
)
INSIDE = ("alice;=1+1", 'x","=1+1', "Lovelace, @SUM(1)")  # a cell of its own elsewhere


def assert_inert(out: str) -> None:
    """No escape sequence, no carriage return, no bell, no bidi override, no C1 control; the
    forged summary is no line of its own."""
    for bad in ("\x1b", "\r", "\x07", "\u202e", "\x9b", "pwned"):
        assert bad not in out, (bad, out)
    assert not any(line.strip(" │|") == FORGED for line in out.splitlines()), out


def report(name: str, *, score_passed: bool = True, notes=()) -> SubmissionReport:
    status = Status.PASSED if score_passed else Status.FAILED
    return SubmissionReport(
        submission=name, style="lab", gradable=True, notes=list(notes),
        results=[CheckResult("I3-fifo-keeps-newest", "the queue is FIFO", "I3", 10.0, status,
                             message="" if score_passed else "the oldest keys were kept")],
        wall_seconds=0.5)


def outcome(name: str, *, student_id: str = "", student_name: str = "", passed=True,
            cached=False) -> Outcome:
    target = Target(path=f"/class/{name}", name=name, student_id=student_id,
                    student_name=student_name)
    return Outcome(target, report(f"/class/{name}", score_passed=passed), cached=cached)


# --------------------------------------------------------------------------- CSV


@pytest.mark.parametrize("payload", FORMULAS)
def test_a_formula_cell_is_neutralised(payload):
    cell = csv_cell(payload)
    assert cell == "'" + shown_name(payload, safe_text.CSV_CELL_CHARS)
    assert "\x1b" not in cell and "\r" not in cell and "\t" not in cell
    if payload.isprintable():
        assert cell == "'" + payload


@pytest.mark.parametrize("payload", INSIDE)
def test_a_formula_after_a_separator_inside_a_cell_is_neutralised(payload):
    cell = csv_cell(payload)
    for separator in ",;\"":
        for piece in cell.split(separator)[1:]:
            assert not piece.lstrip(" ").startswith(FORMULA_START), (payload, cell)
    assert cell.replace("'", "") == payload.replace("'", "")


def test_plain_text_and_numbers_are_left_as_they_are():
    assert csv_cell("alice.py") == "alice.py" and csv_cell("Ada Lovelace") == "Ada Lovelace"
    assert csv_cell("a-b=c") == "a-b=c"  # only the first character counts
    assert csv_cell(0) == 0 and csv_cell(-1.5) == -1.5 and csv_cell(True) is True
    assert csv_cell(None) == ""
    assert csv_cell("x" * 40_000).startswith("x") and len(csv_cell("x" * 40_000)) <= 32_000


def _cells(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _hostile_outcomes() -> list[Outcome]:
    names = FORMULAS + INSIDE + TERMINAL_NAMES
    return [outcome(f"{name}.py" if i % 2 else name, student_id=name, student_name=name,
                    passed=bool(i % 3), cached=bool(i % 2)) for i, name in enumerate(names)]


def test_grades_and_summary_csv_written_by_the_batch_hold_no_formula(tmp_path):
    result = BatchResult(outcomes=_hostile_outcomes(), wall_seconds=1.0)
    write_summary(tmp_path, result, GradeOptions(), shard=None, jobs=1, isolation="test")
    for file in ("grades.csv", "summary.csv", "canvas_import.csv"):
        text = (tmp_path / file).read_text(encoding="utf-8")
        rows = _cells(text)
        headers = 2 if file == "canvas_import.csv" else 1  # Canvas's "Points Possible" row
        assert len(rows) == headers + len(result.outcomes), file
        for row in rows:
            for cell in row:
                assert not cell.startswith(FORMULA_START), (file, cell)
                assert "\x1b" not in cell and "\r" not in cell and "\n" not in cell
        # read with the separator of a semicolon locale, no cell begins a formula either
        for row in csv.reader(io.StringIO(text), delimiter=";"):
            assert not any(cell.startswith(FORMULA_START) for cell in row), (file, row)
    grades = list(csv.DictReader(io.StringIO((tmp_path / "grades.csv").read_text())))
    hyperlink = next(row for row in grades if row["student_id"].startswith("'=HYPERLINK"))
    assert hyperlink["student_id"] == hyperlink["student_name"] == \
        hyperlink["submission"] == "'" + FORMULAS[0]
    assert {row["score"] for row in grades} == {"0", "10"}  # points, as numbers
    assert {row["max_score"] for row in grades} == {"10"}


def test_the_graders_numbers_stay_unquoted_numbers():
    rows = [{"submission": "=1+1", "gradable": True, "score": 9.5234, "max_score": 10.0,
             "failed_checks": ["I3-fifo-keeps-newest"], "wall_seconds": 0.25, "cached": False,
             "style": "lab", "student_id": "@1", "student_name": "-x", "status": "graded",
             "failed_families": ["I3"]}]
    grades = gradebook_csv(rows).splitlines()[1]
    assert grades == '"\'@1","\'-x","\'=1+1","",9.52,10,95.23,"graded","","I3"'
    summary = summary_csv(rows).splitlines()[1]
    assert summary == '"\'=1+1",True,9.5234,10.0,"I3-fifo-keeps-newest",0.25,False,"lab"'


def test_merged_summaries_read_back_are_neutralised_too(tmp_path):
    row = {"submission": '=HYPERLINK("http://x","y")', "gradable": True, "score": 1.0,
           "max_score": 2.0, "failed_checks": ["+cmd"], "wall_seconds": 0.1, "cached": False,
           "style": "@lab", "student_id": "-1", "student_name": "\t=2", "status": "graded",
           "failed_families": ["=I3"]}
    write_merged(tmp_path, {"format": SUMMARY_FORMAT, "submissions": [row]})
    for file in ("grades.csv", "summary.csv"):
        for cells in _cells((tmp_path / file).read_text()):
            assert not any(cell.startswith(FORMULA_START) for cell in cells), (file, cells)


# --------------------------------------------------------------------------- terminal


@pytest.mark.parametrize("name", TERMINAL_NAMES)
def test_shown_name_is_one_inert_line(name):
    shown = shown_name(name)
    assert_inert(shown)
    assert "\n" not in shown and "\t" not in shown and shown.isprintable()
    assert len(shown_name(name * 1000)) <= safe_text.MAX_NAME_CHARS


def test_the_batch_table_and_its_last_lines_are_inert(capsys, monkeypatch):
    from moco_ref.cli import grade_batch
    from moco_ref.cli.tables import print_verdict_line
    from moco_ref.report.scoring import MinScore
    from moco_ref.run.targets import student_label

    result = BatchResult(outcomes=[outcome(name, passed=False) for name in TERMINAL_NAMES])
    for line in grade_batch.batch_summary_lines(result):
        print(line)
    print_verdict_line([shown_name(student_label(o.target)) for o in result.outcomes],
                       len(result.outcomes), MinScore())
    out = capsys.readouterr().out
    assert_inert(out)
    assert "alice.py" in out and "carol.py[9/9] graded dave.py" in out


def test_the_one_by_one_progress_and_summary_lines_are_inert(capsys):
    from moco_ref.cli import grade
    from moco_ref.report.scoring import MinScore

    reports = [report(name, score_passed=False) for name in TERMINAL_NAMES]
    printer = grade._progress_printer(len(reports))
    for each in reports:
        printer(each)
    grade._print_summary(reports, [False] * len(reports), MinScore())
    captured = capsys.readouterr()
    assert_inert(captured.err)
    assert_inert(captured.out)
    assert captured.err.count("\n") == len(reports)  # one line each


def test_the_batch_progress_lines_are_inert():
    from moco_ref.run.progress import Progress

    stream = io.StringIO()
    progress = Progress(stream)
    progress.start(len(TERMINAL_NAMES))
    for name in TERMINAL_NAMES:
        progress.advance(outcome(name))
    progress.stop()
    assert_inert(stream.getvalue())
    assert stream.getvalue().count("\n") == len(TERMINAL_NAMES)


def test_the_rich_progress_bar_reads_no_markup_or_escape_from_a_name():
    pytest.importorskip("rich")
    from moco_ref.run.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for name, shown in (("[blink]\x1b]0;pwned\x07x.py", "[blink]x.py"),
                        ("[link=http://evil]y.py[/link]", "[link=http://evil]y.py[/link]")):
        stream = Terminal()
        progress = Progress(stream)
        progress.start(1)
        progress.advance(outcome(name))
        progress.stop()
        out = stream.getvalue()  # rich's own escape sequences draw the bar: not the name's
        assert "pwned" not in out and "\x1b]" not in out and "\x07" not in out
        assert f"{shown}: 10/10" in out  # the name shown literally, not read as markup


@pytest.mark.parametrize("use_rich", [False, True])
def test_the_report_header_is_inert(use_rich):
    if use_rich:
        pytest.importorskip("rich")
    from moco_ref.report.formats import header_lines, print_reports

    reports = [report(name, score_passed=False, notes=[f"helper modules: {name}"])
               for name in TERMINAL_NAMES]
    out = io.StringIO()
    print_reports(reports, GradeOptions(), file=out, use_rich=use_rich)
    assert_inert(out.getvalue())
    for each in reports:
        assert all("\n" not in line for line in header_lines(each))


def test_the_demo_scoreboard_and_its_surprises_are_inert(tmp_path, capsys):
    from moco_ref.cli.demo import demo_lines
    from moco_ref.run.demo import DemoOutcome, Example, scoreboard_rows

    outcomes = [DemoOutcome(Example(tmp_path / name, "lab", True, (), bug=name),
                            report(name, score_passed=False)) for name in TERMINAL_NAMES]
    rows = scoreboard_rows(outcomes, tmp_path)
    print("\n".join(demo_lines(outcomes, rows, None, None, width=80)))  # surprises included
    assert_inert(capsys.readouterr().out)


def _summary(place: Path, scores: dict[str, float]) -> None:
    place.mkdir()
    rows = [{"submission": name, "gradable": True, "score": score, "max_score": 10.0,
             "failed_checks": [] if score == 10 else [f"I3\x1b[2J{name}"], "status": "graded",
             "failed_families": ["I3\x1b]0;pwned\x07"] if score < 10 else []}
            for name, score in scores.items()]
    (place / "summary.json").write_text(json.dumps(
        {"format": SUMMARY_FORMAT, "submissions": rows}), encoding="utf-8")


def test_diff_grades_merge_notes_and_class_report_are_inert(tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    _summary(old, {name: 10.0 for name in TERMINAL_NAMES})
    _summary(new, {name: 5.0 for name in TERMINAL_NAMES})
    assert main(["diff-grades", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert_inert(out)
    assert out.count("\n") == len(TERMINAL_NAMES) + 1
    assert main(["grade", "--merge", str(old), str(new), "--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert_inert(out)
    assert out.count("note: ") == len(TERMINAL_NAMES)
    assert main(["class-report", str(new)]) == 0
    assert_inert(capsys.readouterr().out)


def test_a_usage_error_naming_a_file_is_one_inert_line(capsys):
    from moco_ref.cli.options import usage_error

    assert usage_error(f"refusing member {TERMINAL_NAMES[4]}{TERMINAL_NAMES[0]}") == 2
    err = capsys.readouterr().err
    assert_inert(err)
    assert err.count("\n") == 1 and err.startswith("moco-ref: error: refusing member eve.py")


def test_the_rerun_command_names_the_submission_inertly():
    from moco_ref.report.scoring import rerun_command

    command = rerun_command(TERMINAL_NAMES[1] + TERMINAL_NAMES[4], "I3")
    assert_inert(command)
    assert "\n" not in command


# --------------------------------------------------------------------------- Markdown

TICKED = (
    "a`b``c```d.py",
    "`x.py",
    "x.py`",
    "``",
    "` <img src=x onerror=alert(1)> `",
    "y`` [link](javascript:alert(1)) <b>bold<b> ``.py",
    "```\n# heading\n```",
)


def commonmark():
    """A CommonMark parser (markdown-it comes with rich)."""
    return pytest.importorskip("markdown_it").MarkdownIt("commonmark")


def _rendered_inline(markdown: str) -> str:
    return commonmark().renderInline(markdown)


def test_a_code_span_cannot_be_broken_out_of():
    rng = random.Random(26)
    samples = list(TICKED) + ["".join(rng.choice("`` a<>*_[]()") for _ in range(rng.randint(
        1, 16))) for _ in range(400)]
    for sample in samples:
        shown = " ".join(sample.split())
        if not shown:
            continue
        assert _rendered_inline(code_span(sample)) == f"<code>{html.escape(shown, False)}</code>", \
            sample


def test_a_fence_holds_a_message_with_fences_inside():
    message = "```\n</pre><script>alert(1)</script>\n````\n# not a heading\n```python"
    rendered = commonmark().render(fence(message))
    assert rendered == f"<pre><code class=\"language-text\">{html.escape(message, False)}\n" \
                       "</code></pre>\n"


def _tmp_report(folder: Path, name: str) -> SubmissionReport:
    return report(str(folder / name), score_passed=False)


@pytest.mark.parametrize("name", TICKED[:6])
def test_the_markdown_feedback_page_names_the_submission_in_an_intact_span(tmp_path, name):
    from moco_ref.report.feedback import feedback_markdown

    page = feedback_markdown(_tmp_report(tmp_path, name + ".py"), draw=False)
    heading = page.splitlines()[0]
    rendered = commonmark().render(heading)
    shown = " ".join((name + ".py").split())
    assert rendered == f"<h1>Feedback on <code>{html.escape(shown, False)}</code></h1>\n"


@pytest.mark.parametrize("name", TICKED[:6])
def test_the_gradescope_summary_names_the_submission_in_an_intact_span(tmp_path, name):
    from moco_ref.platforms.gradescope.writer import gradescope_results

    data = gradescope_results(_tmp_report(tmp_path, name + ".py"))
    first = data["output"].splitlines()[0]
    rendered = commonmark().renderInline(first)
    shown = " ".join((name + ".py").split())
    assert f"graded <code>{html.escape(shown, False)}</code> (style lab)" in rendered
    assert "<img" not in rendered and "<a " not in rendered and "<b>" not in rendered


def test_no_renderer_puts_text_between_backticks_by_hand():
    """Every f-string of ``moco_ref/report`` that opens a backtick just before a value is a
    code span made by hand: ``text.code_span`` (or ``fence``) must make it."""
    folder = Path(safe_text.__file__).parent
    found = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr):
                continue
            for before, after in zip(node.values, node.values[1:]):
                if isinstance(before, ast.Constant) and isinstance(after, ast.FormattedValue) \
                        and str(before.value).endswith("`"):
                    found.append(f"{path.name}:{node.lineno}")
    assert found == []


LINKS = ("https://evil.example/phish?x=1", "http://evil.example", "www.evil.example/x",
         "student@evil.example", "ftp://evil.example/f")


def _autolinks(markdown: str) -> list[str]:
    """Where a GitHub-flavoured renderer (Gradescope's) would start a live link on its own: a
    scheme's ``://``, a ``www.``, an e-mail's ``@``, none of them backslash-escaped (the
    extended-autolink rules of the GFM spec)."""
    return re.findall(r"(?i)(?<!\\)\b\w+://|(?<![\\\w])www\.|\w@\w", markdown)


def test_a_url_a_notebook_prints_is_never_a_live_link_on_gradescope(tmp_path):
    """A URL in the notes (a cell the grader skipped) or in the reason a notebook could not
    be graded reaches the Gradescope Markdown escaped: read literally, never linked."""
    from moco_ref.platforms.gradescope.writer import gradescope_results

    printed = " and ".join(LINKS)
    graded = _tmp_report(tmp_path, "alice.py")
    graded.notes = [f"skipped a cell that printed {printed}"]
    broken = SubmissionReport(str(tmp_path / "bob.ipynb"), "lab", False,
                              traceback=f"Traceback (most recent call last):\nValueError: "
                                        f"see {printed}")
    for report_ in (graded, broken):
        data = gradescope_results(report_)
        texts = [data["output"]] + [test["output"] for test in data["tests"]]
        for text in texts:
            outside = re.sub(r"(?s)```.*?```|`[^`]*`", "", text)  # code is never linked
            assert not _autolinks(outside), outside
        assert any("evil" in text for text in texts)  # it is shown, as text
    assert _autolinks(printed)  # meta: the finder sees each of them raw
    assert len(_autolinks(printed)) == len(LINKS)
