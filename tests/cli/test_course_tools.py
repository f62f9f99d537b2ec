"""The course tools (issue 28.8): ``rubric show`` prints the visibility and output settings
and, for a file that does not exist yet, a complete rubric to start from; ``class-report``
on a merged output says what it lacks; the pytest plugin's node ids run again as printed,
``-k`` grades only what it selects and JUnit carries the time really spent."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import tomllib

# Imported here, before pytester snapshots sys.modules: torch cannot be imported twice.
import moco_ref.cli.pytest_plugin  # noqa: F401
import moco_ref.run.pipeline  # noqa: F401
from moco_ref.cli import main
from moco_ref.judge.registry import FAMILIES
from moco_ref.judge.rubric import rubric_from_mapping
from moco_ref.run.batch import SUMMARY_FORMAT
from tests.helpers.grading_stubs.fixtures import BAD_FIFO_WARMUP, stubbed, write  # noqa: F401

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

PLUGIN = "moco_ref.cli.pytest_plugin"


# --------------------------------------------------------------------------- rubric show


def test_rubric_show_prints_visibility_and_output_settings(tmp_path, capsys):
    course = tmp_path / "course.toml"
    course.write_text('total = 50\n[visibility]\nI4 = "after_due_date"\n'
                      '"I9-batch-not-own-negative" = "hidden"\n'
                      "[output]\nshow_submission_output = true\n", encoding="utf-8")
    assert main(["rubric", "show", str(course), "--style", "lab"]) == 0
    out = capsys.readouterr().out
    assert "I4-same-source-masked  [after_due_date]" in out
    assert "I9-batch-not-own-negative  [hidden]" in out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "I4 after_due_date shown after the due date" in lines
    assert "every other check: visible (shown to students at once)" in lines
    assert any(line.startswith("show_submission_output = true") for line in lines)
    assert main(["rubric", "show", str(course), "--style", "lab", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["output"] == {"show_submission_output": True}
    assert data["visibility_by_check"]["lab"]["I4-positive-never-masked"] == "after_due_date"
    assert data["visibility_by_check"]["lab"]["I1-key-grads-none"] == "visible"


def test_rubric_show_of_a_file_not_there_yet_prints_a_complete_example(tmp_path, capsys):
    missing = tmp_path / "course.toml"
    assert main(["rubric", "show", str(missing)]) == 2
    captured = capsys.readouterr()
    assert "does not exist yet" in captured.err and "--example" in captured.err
    data = tomllib.loads(captured.out)  # the example alone on stdout: valid TOML
    assert set(data) == {"total", "families", "checks", "visibility", "output"}
    assert set(data["families"]) == set(FAMILIES)  # every family, with its default weight
    rubric = rubric_from_mapping(data)  # and a rubric moco-ref accepts
    assert rubric.visibility_of("I4-same-source-masked") == "after_due_date"
    assert main(["rubric", "show", "--example"]) == 0
    assert capsys.readouterr().out == captured.out
    missing.write_text(captured.out, encoding="utf-8")
    assert main(["rubric", "show", str(missing), "--style", "lab"]) == 0


# --------------------------------------------------------------------------- class-report


def _graded_output(place: Path, students: dict[str, list[str]]) -> None:
    """A batch output: summary.json and one report per student, ``students`` mapping each
    to the families of its failed checks."""
    place.mkdir()
    rows = []
    for name, families in students.items():
        rows.append({"submission": name, "gradable": True, "score": 10.0 - len(families),
                     "max_score": 10.0, "status": "graded", "failed_families": families,
                     "failed_checks": [f"{f}-check" for f in families]})
        results = [{"check_id": f"{f}-check", "family": f, "status": "failed",
                    "message": "wrong", "details": {"misconception": f"{f} misread"}}
                   for f in families]
        (place / f"{name}.json").write_text(json.dumps(
            {"format": "moco-ref-grade/1", "reports": [{"results": results}]}),
            encoding="utf-8")
    (place / "summary.json").write_text(json.dumps(
        {"format": SUMMARY_FORMAT, "submissions": rows}), encoding="utf-8")


def test_class_report_on_a_merged_output_says_what_it_lacks(tmp_path, capsys):
    first, second, merged = tmp_path / "shard1", tmp_path / "shard2", tmp_path / "merged"
    _graded_output(first, {"alice.py": ["I3"], "bob.py": ["I3", "I4"]})
    _graded_output(second, {"carol.py": ["I4"]})
    assert main(["class-report", str(first)]) == 0
    whole = capsys.readouterr().out
    assert "broken by 2, not passed by 2" in whole and "no report" not in whole
    assert main(["grade", "--merge", str(first), str(second), "--out", str(merged)]) == 0
    capsys.readouterr()
    assert main(["class-report", str(merged)]) == 0
    out = capsys.readouterr().out
    assert "broken by 0" not in out  # not counted: the reports are not there
    flat = " ".join(out.split())
    assert "all 3 submission(s) have no report in this folder" in flat
    assert "merged output" in flat and str(first) in flat and str(second) in flat
    assert "I3 broken by ? (no reports), not passed by 2" in flat


# --------------------------------------------------------------------------- pytest plugin


@pytest.fixture
def run_pytest(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # exactly this plugin, once

    def run(*arguments: str):
        return pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider", *arguments)

    return run


@pytest.mark.usefixtures("stubbed")
def test_a_node_id_runs_again_as_printed(pytester, run_pytest):
    write(pytester.path, "student_moco.py", BAD_FIFO_WARMUP)
    first = run_pytest("--moco-impl=student_moco.py", "-v")
    node = "student_moco.py::W1-warmup-fifo"
    assert any(line.startswith(f"{node} FAILED") for line in first.outlines)
    again = run_pytest("--moco-impl=student_moco.py", node, "-v")
    again.assert_outcomes(failed=1)  # that check alone, not the file as a test module
    assert f"{node} FAILED" in again.stdout.str() and "W2-warmup-ema" not in again.stdout.str()


@pytest.mark.usefixtures("stubbed")
def test_k_grades_only_what_it_selects_and_junit_has_the_time_spent(pytester, run_pytest,
                                                                     monkeypatch):
    from moco_ref.run import pipeline

    real, graded = pipeline.grade_submission, []

    def slow_grade(target, options=None, **kwargs):
        graded.append(options.checks)
        time.sleep(0.5)  # a grading that takes time
        return real(target, options, **kwargs)

    monkeypatch.setattr(pipeline, "grade_submission", slow_grade)
    write(pytester.path, "student_moco.py", BAD_FIFO_WARMUP)
    junit = pytester.path / "junit.xml"
    result = run_pytest("--moco-impl=student_moco.py", "-k", "W1", f"--junitxml={junit}")
    result.assert_outcomes(failed=1, deselected=2)
    assert graded == [("W1-warmup-fifo",)]  # graded once, on the selected check only
    cases = ET.parse(junit).getroot().findall(".//testcase")
    assert [case.get("name") for case in cases] == ["W1-warmup-fifo"]
    assert float(cases[0].get("time")) >= 0.5  # the grading, not 0
