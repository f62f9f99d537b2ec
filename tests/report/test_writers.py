"""The table of writers: a new output is one ``Writer``; a student's writer is handed the
student's view, never the raw report; where files go with and without FILE."""

from __future__ import annotations

import json

import pytest

from moco_ref.cli import main
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import rubric_from_mapping
from moco_ref.platforms import platforms, writers
from moco_ref.probe.options import GradeOptions
from moco_ref.report import writers as writers_module
from moco_ref.report.student_view import StudentView
from moco_ref.report.writers import Writer, Writing
from moco_ref.run import pipeline

HIDDEN = "I9-batch-not-own-negative"
MISCONCEPTION = "the batch's own keys appended to the queue's negatives"


def _report(target: str) -> SubmissionReport:
    return SubmissionReport(target, "lab", True, [
        CheckResult("I3-fifo-keeps-newest", "FIFO keeps the newest", "I3", 5, Status.PASSED),
        CheckResult(HIDDEN, "the batch is not its own negative", "I9", 5, Status.FAILED,
                    f"step 1: {MISCONCEPTION}"),
    ])


@pytest.fixture
def graded(monkeypatch, tmp_path):
    """``grade`` without child processes: every target gets ``_report``."""
    monkeypatch.setattr(pipeline, "grade_many", lambda targets, options=None, **_: [
        _report(target) for target in targets])
    monkeypatch.chdir(tmp_path)
    for name in ("alice", "bob"):
        (tmp_path / f"{name}.py").write_text("", encoding="utf-8")
    return tmp_path


def test_the_table_names_each_output_once_with_its_own_file():
    table = writers()
    assert {"json", "junit", "text", "feedback-html", "feedback-md", "gradescope",
            "prairielearn"} <= set(table)
    suffixes = [writer.suffix for writer in table.values()]
    assert len(suffixes) == len(set(suffixes))
    assert {name for name, w in table.items() if w.audience == "student"} == {
        "feedback-html", "feedback-md", "gradescope", "prairielearn"}
    for platform in platforms().values():  # each platform brings its own writer
        assert table[platform.name] is platform.writer


@pytest.mark.parametrize("name", ["feedback-html", "feedback-md", "gradescope", "prairielearn"])
def test_a_student_writer_gets_the_student_view_and_withholds_a_hidden_check(name):
    writer = writers()[name]
    seen = []

    def spy(subject, writing):
        seen.append(subject)
        return writer.render_subject(subject, writing)

    rubric = rubric_from_mapping({"visibility": {HIDDEN: "hidden"}})
    spied = Writer(writer.name, writer.summary, writer.suffix, spy, showing=writer.showing)
    text = spied.render(_report("/course/alice.py"), Writing(GradeOptions(), rubric))
    assert [type(subject) for subject in seen] == [StudentView]
    shown = _shown_now(name, text)
    assert MISCONCEPTION not in shown and HIDDEN not in shown


def _shown_now(name: str, text: str) -> str:
    """What the student reads now: Gradescope holds back a test whose visibility is not
    ``visible`` itself (the results keep it, for the staff and for later)."""
    if name != "gradescope":
        return text
    data = json.loads(text)
    return json.dumps([data["output"], data["extra_data"]] + [
        test for test in data["tests"] if test["visibility"] == "visible"])


def test_a_new_output_is_one_writer(graded, monkeypatch, capsys):
    toy = Writer("toy", "the score alone", ".score.txt",
                 lambda report, writing: f"{report.score:g}/{report.max_score:g}\n")
    monkeypatch.setitem(writers_module.REPORT_WRITERS, "toy", toy)
    assert main(["grade", "--isolation", "processes", "alice.py", "bob.py",
                 "--write", "toy", "--min-score", "0"]) == 0
    assert (graded / "alice.score.txt").read_text() == "5/10\n"
    assert (graded / "bob.score.txt").read_text() == "5/10\n"
    assert "toy for alice.py written to alice.score.txt" in capsys.readouterr().out


def test_a_file_holds_several_submissions_only_in_a_format_that_holds_several(graded, capsys):
    assert main(["grade", "--isolation", "processes", "alice.py", "bob.py",
                 "--write", "junit=all.xml", "--min-score", "0"]) == 0
    assert (graded / "all.xml").read_text().count("<testsuite ") == 2
    assert main(["grade", "--isolation", "processes", "alice.py", "bob.py",
                 "--write", "gradescope=one.json", "--min-score", "0"]) == 2
    assert "gradescope writes one submission per file; got 2" in capsys.readouterr().err
    assert not (graded / "one.json").exists()


def test_without_file_each_submission_gets_its_own(graded):
    assert main(["grade", "--isolation", "processes", "alice.py", "--gradescope",
                 "--min-score", "0"]) == 0
    data = json.loads((graded / "alice.gradescope.json").read_text())
    assert [test["status"] for test in data["tests"]] == ["passed", "failed"]


def test_an_unknown_output_is_one_usage_line(graded, capsys):
    assert main(["grade", "--isolation", "processes", "alice.py", "--write", "pdf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--write pdf: no such output" in err[0] and "gradescope" in err[0]
