"""Verdicts out: the terminal table, JSON, JUnit XML and Gradescope results.json, on reports
built by hand (no submission runs here)."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

import pytest

from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.platforms.gradescope.writer import WRITER as GRADESCOPE
from moco_ref.platforms.gradescope.writer import gradescope_results
from moco_ref.probe.options import GradeOptions
from moco_ref.report.formats import (
    JSON_FORMAT,
    REASON_WIDTH,
    print_reports,
    render_text,
    to_json,
    write_junit,
)
from moco_ref.report.scoring import MinScore, failed_families, meets, rerun_command
from moco_ref.report.writers import Writing

FIFO_MESSAGE = (
    "queue kept the oldest keys: after enqueueing ids [7, 8] into [1..4] with capacity 4, "
    "expected ids [3, 4, 7, 8], got [1, 2, 3, 4]"
)


def _graded() -> SubmissionReport:
    return SubmissionReport(
        submission="subs/alice.ipynb",
        style="lab",
        gradable=True,
        results=[
            CheckResult("I1-key-grads-none", "key grads stay None", "I1", 2, Status.PASSED,
                        seconds=0.0421),
            CheckResult("I3-fifo-keeps-newest", "FIFO drops the oldest", "I3", 3, Status.FAILED,
                        FIFO_MESSAGE, {"expected": [3, 4, 7, 8], "loss": float("nan")}),
            CheckResult("I6-orders", "step orders agree", "I6", 2, Status.TIMEOUT, "too slow"),
            CheckResult("B1-ddp", "gathers keys", "builder", 1, Status.NOT_APPLICABLE,
                        "does not apply to style lab"),
        ],
        inferred={"order": "lab", "m": 0.95, "capacity": 240, "batch_size": 60},
        notes=["cell 7: skipped top-level work `train_moco(initial, x, train)` (line 1)"],
        stdout="printed \x1b[31mred\x1b[0m and a NUL \x00",
        wall_seconds=8.25,
    )


def _not_gradable() -> SubmissionReport:
    return SubmissionReport(
        submission="subs/bob.py", style="unknown", gradable=False,
        traceback='Traceback (most recent call last):\n  File "bob.py", line 1\n'
                  "ModuleNotFoundError: No module named 'tensorflow'\n",
    )


def test_scores_thresholds_and_families():
    report = _graded()
    assert (report.score, report.max_score) == (2, 7)
    assert failed_families(report) == ["I3", "I6"]
    assert not meets(report, MinScore()) and meets(report, MinScore.parse("2"))
    assert meets(report, MinScore.parse("28%")) and not meets(report, MinScore.parse("29%"))
    assert not meets(_not_gradable(), MinScore.parse("0"))
    with pytest.raises(ValueError):
        MinScore.parse("120%")


def test_rerun_command_repeats_non_default_options():
    options = GradeOptions(style="lab", temperature=0.07, execute_all_cells=True)
    assert rerun_command("my sub.py", "I3-fifo", options) == (
        "moco-ref grade 'my sub.py' --check I3-fifo --style lab --temperature 0.07 "
        "--execute-all-cells"
    )


def test_plain_text_table_has_header_rows_and_rerun_commands():
    text = render_text([_graded(), _not_gradable()])
    assert "subs/alice.ipynb — style lab — score 2/7 (8.2 s)" in text
    assert "inferred: m=0.95, capacity=240, batch size=60, order=lab" in text
    assert "note: cell 7: skipped top-level work" in text
    assert "FAILED" in text and "0/3" in text
    assert " ".join(FIFO_MESSAGE.split()) in " ".join(text.split())  # whole, wrapped at spaces
    assert "NOT APPLICABLE" in text and "–" in text
    assert "rerun: moco-ref grade subs/alice.ipynb --check I3-fifo-keeps-newest" in text
    assert "rerun: moco-ref grade subs/alice.ipynb --check I6-orders" in text
    assert "I1-key-grads-none" in text and "--check I1-key" not in text
    assert "subs/bob.py — style unknown — NOT GRADABLE" in text
    assert "No module named 'tensorflow'" in text


def test_rich_table_prints_student_text_literally():
    stream = io.StringIO()
    print_reports([_graded()], file=stream, use_rich=True)
    out = stream.getvalue()
    assert "[3, 4, 7, 8]" in out  # not swallowed as rich markup
    assert "moco-ref grade subs/alice.ipynb --check I3-fifo-keeps-newest" in out


def test_json_schema():
    data = json.loads(to_json([_graded(), _not_gradable()], min_score="full marks"))
    assert data["format"] == JSON_FORMAT and data["min_score"] == "full marks"
    first, second = data["reports"]
    assert {"submission", "style", "gradable", "score", "max_score", "inferred", "notes",
            "traceback", "stdout", "stderr", "wall_seconds", "results"} <= set(first)
    fifo = first["results"][1]
    assert fifo["status"] == "failed" and fifo["points"] == 0 and fifo["max_points"] == 3
    assert fifo["details"]["loss"] == "nan"  # strict JSON
    assert fifo["rerun"].endswith("--check I3-fifo-keeps-newest")
    assert "rerun" not in first["results"][0]
    assert second["gradable"] is False and "tensorflow" in second["traceback"]


def test_junit_xml_parses_and_maps_statuses(tmp_path):
    path = tmp_path / "junit.xml"
    write_junit([_graded(), _not_gradable()], path)
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors"),
            root.get("skipped")) == ("5", "1", "2", "1")
    alice, bob = root.findall("testsuite")
    cases = {case.get("name"): case for case in alice.findall("testcase")}
    assert list(cases["I1-key-grads-none"]) == []
    assert cases["I1-key-grads-none"].get("time") == "0.042"  # the grader's time judging it
    assert alice.get("time") == "8.250"
    failure = cases["I3-fifo-keeps-newest"].find("failure")
    assert failure.get("message") == FIFO_MESSAGE and "rerun: moco-ref grade" in failure.text
    assert cases["I6-orders"].find("error").get("type") == "timeout"
    assert cases["B1-ddp"].find("skipped").get("message") == "does not apply to style lab"
    assert "\x00" not in alice.find("system-out").text
    properties = {p.get("name"): p.get("value") for p in alice.find("properties")}
    assert properties["inferred.m"] == "0.95" and properties["score"] == "2"
    assert "tensorflow" in bob.find("testcase/error").text


def test_a_check_s_judging_time_survives_the_report_s_round_trip():
    report = _graded()
    again = SubmissionReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert [r.seconds for r in again.results] == [0.0421, 0.0, 0.0, 0.0]
    older = report.to_dict()
    for result in older["results"]:  # a cache entry written before the field existed
        result.pop("seconds")
    older["results"][1]["seconds"] = "soon"  # or one a hand edited
    assert [r.seconds for r in SubmissionReport.from_dict(older).results] == [0.0] * 4


def test_gradescope_results_schema(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(GRADESCOPE.render(_graded(), Writing(GradeOptions())), encoding="utf-8")
    data = json.loads(path.read_text())
    assert data["score"] == 2 and data["execution_time"] == 9
    assert data["output_format"] == "md" and data["stdout_visibility"] == "hidden"
    assert "m=0.95" in data["output"] and "B1-ddp" in data["output"]
    assert [test["name"].split(":")[0] for test in data["tests"]] == [
        "I1-key-grads-none", "I3-fifo-keeps-newest", "I6-orders"  # not applicable: not a test
    ]
    for test in data["tests"]:
        assert set(test) == {"name", "number", "score", "max_score", "status", "output",
                             "output_format", "visibility", "tags"}
        assert test["status"] in ("passed", "failed") and test["visibility"] == "visible"
        assert "rerun" not in test["output"]  # students get no local commands
    passed, fifo, timeout = data["tests"]
    assert (passed["score"], passed["max_score"], passed["status"]) == (2, 2, "passed")
    assert (fifo["score"], fifo["max_score"], fifo["status"]) == (0, 3, "failed")
    assert FIFO_MESSAGE in fifo["output"] and "Timed out" in timeout["output"]
    assert timeout["tags"] == ["I6", "timeout"] and fifo["number"] == "I3.1"


def test_gradescope_not_gradable_shows_the_traceback():
    data = gradescope_results(_not_gradable())
    assert data["score"] == 0 and data["tests"][0]["status"] == "failed"
    assert "tensorflow" in data["tests"][0]["output"] and "tensorflow" in data["output"]


def test_the_terminal_report_is_a_summary_table_then_details_unless_brief():
    """The table carries one line per check; each check not passed then gets its whole
    message at full width, with its rerun command; ``brief`` keeps the table alone."""
    report = _graded()
    failed = next(r for r in report.results if r.status.value == "failed")
    stream = io.StringIO()
    print_reports([report], file=stream, use_rich=True)
    full = stream.getvalue()
    assert f"{failed.check_id} — failed" in full
    assert " ".join(failed.message.splitlines()[0].split()) in " ".join(full.split())
    stream = io.StringIO()
    print_reports([report], file=stream, use_rich=True, brief=True)
    brief = stream.getvalue()
    assert f"{failed.check_id} — failed" not in brief and failed.check_id in brief
    assert f"--check {failed.check_id}" in brief
    text = render_text([report], brief=True)
    assert all(len(line) <= 28 + REASON_WIDTH for line in text.splitlines()
               if not line.startswith(("==", "   rerun", "   note", "   inferred")))


def test_gradescope_numbers_betray_no_withheld_test():
    """Within a family the tests a student sees sooner are numbered first: with the first
    I3 check hidden and the second shown after the due date, the visible one is I3.1, so no
    gap in what a student sees tells that a withheld test exists."""
    from moco_ref.judge.rubric import Rubric

    report = SubmissionReport(
        submission="subs/carol.py", style="lab", gradable=True,
        results=[CheckResult(check_id, check_id, "I3", 1, Status.PASSED) for check_id in (
            "I3-fifo-keeps-newest", "I3-oldest-first-order", "I3-ids-move-with-keys")])
    rubric = Rubric(visibility={"I3-fifo-keeps-newest": "hidden",
                                "I3-oldest-first-order": "after_due_date"})
    numbers = {test["name"].split(":")[0]: test["number"]
               for test in gradescope_results(report, rubric=rubric)["tests"]}
    assert numbers == {"I3-ids-move-with-keys": "I3.1", "I3-oldest-first-order": "I3.2",
                       "I3-fifo-keeps-newest": "I3.3"}
