"""The terminal report fits 80 columns when it is not printed to a terminal (piped, to a
file) unless ``COLUMNS`` says otherwise; the checks that do not apply fold into one line,
and a crash is told once, not as "not run" once per check (issue 28.6)."""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys

import pytest
from rich.cells import cell_len

from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.report.formats import command_lines, print_reports, render_text
from tests.helpers.conformance_support import SUBMISSIONS

CRASH = ("train_moco raised at step 5 (epoch 1, batch 2 of the epoch, after 270 keys had "
         "been made)")
NOT_APPLICABLE = "does not apply to lab submissions"


def _crashed_report(submission: str = "subs/alice.py") -> SubmissionReport:
    results = [CheckResult("contract-returns-seven-values", "returns seven values", "contract",
                           2, Status.ERROR, CRASH + ":\nTraceback (most recent call last):\n"
                           "RuntimeError: mat1 and mat2 shapes cannot be multiplied")]
    for number, family in enumerate(("I1", "I2", "I3", "I4", "I6", "I7", "I8", "I9")):
        results.append(CheckResult(
            f"{family}-check-number-{number}", f"a check of {family}", family, 3,
            Status.NOT_JUDGED,
            f"not run: {CRASH} (told in full under contract-returns-seven-values)",
            {"needs": "contract-returns-seven-values"}))
    results += [CheckResult(f"B{n}-builder-only-check", "a builder check", "I3", 0,
                            Status.NOT_APPLICABLE, NOT_APPLICABLE) for n in range(3)]
    results.append(CheckResult("I5-fifo-letters", "the warm-up FIFO", "I5", 3, Status.PASSED,
                               "the warm-up FIFO keeps ['c', 'd', 'e', 'f']"))
    return SubmissionReport(submission, "lab", True, results, inferred={"style": "lab"},
                            wall_seconds=2.0, isolation="processes: for trusted code only "
                            "(the submission runs as the grader's user and can read and write "
                            "what it can)")


def _printed(report, *, use_rich: bool, brief: bool = False) -> str:
    stream = io.StringIO()
    print_reports([report], file=stream, use_rich=use_rich, brief=brief)
    return stream.getvalue()


def _too_wide(text: str, width: int = 80) -> list[str]:
    return [line for line in text.splitlines() if cell_len(line) > width]


@pytest.mark.parametrize("use_rich", [True, False])
def test_not_applicable_checks_fold_into_one_line_and_a_crash_is_told_once(use_rich,
                                                                          monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    report = _crashed_report()
    out = _printed(report, use_rich=use_rich)
    flat = " ".join(out.split())
    assert "B0-builder-only-check" not in out and "B2-builder-only-check" not in out
    assert out.count(NOT_APPLICABLE) == 1 and "3 checks (does not apply to lab" in flat
    if use_rich:
        assert "not applicable: 3 checks (does not apply to lab submissions)" in flat
    assert out.lower().count("not run") == 1 and "8 checks" in flat  # once, for all eight
    assert out.count(CRASH.split(" (")[0]) == 2  # the fold and the check that tells it
    assert "I1-check-number-0" not in out and "I9-check-number-7" not in out
    assert "contract-returns-seven-values" in out and "I5-fifo-letters" in out
    assert not _too_wide(out), _too_wide(out)  # the evidence too: wrapped, never cut


@pytest.mark.parametrize("use_rich", [True, False])
def test_a_long_reason_wraps_at_spaces_and_is_never_cut(use_rich, monkeypatch):
    """The evidence of a failed check (here 540 characters on one line) fits 80 columns and
    every word of it is printed, in order."""
    monkeypatch.delenv("COLUMNS", raising=False)
    words = [f"word{n}-of-the-evidence" for n in range(24)]
    report = SubmissionReport("subs/bob.py", "lab", True, [CheckResult(
        "I4-same-source-masked", "mask", "I4", 6.35, Status.FAILED, " ".join(words))])
    out = _printed(report, use_rich=use_rich)
    assert not _too_wide(out), _too_wide(out)
    flat = out.split()
    positions = [flat.index(word) for word in words]
    assert positions == sorted(positions)


def test_a_lone_check_waiting_for_another_keeps_its_row():
    report = _crashed_report()
    report.results = [r for r in report.results if r.check_id != "I2-check-number-1"
                      and not r.check_id.startswith(("I3", "I4", "I6", "I7", "I8", "I9"))]
    out = _printed(report, use_rich=True)
    assert "I1-check-number-0" in out and "not applicable: 3 checks" in out


def test_piped_the_report_is_80_columns_wide_unless_columns_says_otherwise(monkeypatch):
    long_name = "a-student-folder-with-a-long-name/moco_lab_07_submission.py"
    report = _crashed_report(long_name)
    report.notes = ["helper modules: " + ", ".join(f"helper_{n}.py" for n in range(20))]
    monkeypatch.delenv("COLUMNS", raising=False)
    brief = _printed(report, use_rich=True, brief=True)
    assert not _too_wide(brief), _too_wide(brief)
    assert not _too_wide(render_text([report], brief=True))
    monkeypatch.setenv("COLUMNS", "120")
    wide = _printed(report, use_rich=True, brief=True)
    assert _too_wide(wide) and not _too_wide(wide, 120)  # the table takes what it is given


def test_a_long_rerun_command_breaks_into_shell_continuations():
    command = shlex.join(["moco-ref", "grade", "class/" + "x" * 50 + "/moco lab.py",
                          "--check", "I4-same-source-masked", "--temperature", "0.07"])
    lines = command_lines(command, 80)
    assert len(lines) > 2 and lines[0] == "rerun:" and all(len(line) <= 80 for line in lines)
    pasted = " ".join(line.removesuffix("\\") for line in lines[1:])
    assert shlex.split(pasted) == shlex.split(command)
    assert command_lines("moco-ref grade a.py --check I3", 80) == [
        "rerun: moco-ref grade a.py --check I3"]


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_grade_piped_prints_80_columns_and_tells_a_crash_once():
    """The command itself, its output piped: the summary table fits 80 columns (it was 120
    wide), the lab-irrelevant checks are one line, the crash one line."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    run = subprocess.run(
        [sys.executable, "-m", "moco_ref.cli", "grade", "--brief", "--isolation", "processes",
         "bug_crash_when_queue_full.py"],
        cwd=SUBMISSIONS, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert not _too_wide(run.stdout), _too_wide(run.stdout)
    assert run.stdout.count("not run") == 1 and run.stdout.count("not applicable") == 1
    assert "not applicable: 6 checks (does not apply to lab submissions)" in run.stdout
    assert "contract-returns-seven-values" in run.stdout


def test_the_demo_piped_fits_80_columns_and_never_breaks_a_name(tmp_path, monkeypatch):
    """A line per example at 80 columns: a long name is shortened in the middle (its head and
    tail kept, never broken across lines), a long verdict wraps at spaces, and the whole
    scoreboard (with the bug texts) goes to the file the last line names."""
    from moco_ref.cli.demo import _write_board, demo_lines
    from moco_ref.run.demo import DemoOutcome, Example, scoreboard_rows

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    names = ["two_styles_deletes_train_moco_to_be_detected_as_builder_by_the_grader.py",
             "short.py"]
    bug = ("LAB entry points with the I4 bug beside a correct MoCo class; deletes train_moco "
           "at import to be detected as builder: the style is read from the source")
    outcomes = [DemoOutcome(Example((tmp_path / "corpus" / name).resolve(), "lab", False,
                                    ("contract", "I1", "I2", "I3", "I4", "I6", "I7", "I8", "I9"),
                                    bug=bug), _crashed_report(name)) for name in names]
    rows = scoreboard_rows(outcomes, tmp_path / "corpus")
    board = _write_board(rows, tmp_path / "board")
    lines = demo_lines(outcomes, rows, None, board, width=80)
    assert not _too_wide("\n".join(lines[:-1])), _too_wide("\n".join(lines))
    text = "\n".join(lines)
    long_name = names[0]
    assert long_name not in text  # shortened, not wrapped
    shown = next(line.split()[1] for line in lines if line.startswith(("✓", "✗"))
                 and "…" in line)
    head, tail = shown.split("…")
    assert long_name.startswith(head) and long_name.endswith(tail) and len(head) > 8
    assert lines[-1].strip() == str(board) or lines[-1].endswith(str(board))  # whole, last
    assert " ".join(bug.split()) in board.read_text(encoding="utf-8")
