"""A course, end to end, as a teacher and a student meet it: a Gradescope-shaped export (a
group of two, a student with a bug, a PDF-only student, an empty file) graded with a rubric of
total 50 that hides the family of the bug's check (I4) and shows I8 after the due date →
grades.csv and the Canvas import file → Gradescope results → PrairieLearn results → feedback
pages → the class report; every number, every row and every field a student sees is checked.

The expected points are derived here from the rubric's rule (equal family shares of the total,
the warm-up shape half; inside I4 the two checks' declared weights 2 : 1), not read from the
grader's own tables."""

from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path

import pytest

from moco_ref.cli import main
from moco_ref.judge.results import SubmissionReport
from moco_ref.judge.rubric import load_rubric
from moco_ref.platforms.gradescope.writer import gradescope_results
from moco_ref.platforms.prairielearn.writer import prairielearn_results
from moco_ref.report.class_report import class_report
from moco_ref.report.feedback import render_feedback
from tests.helpers.conformance_support import SUBMISSIONS

pytestmark = pytest.mark.full  # the second tier: a whole course export, sandboxed

TOTAL = 50
RUBRIC = """\
total = 50
[visibility]
I4 = "hidden"
I8 = "after_due_date"
"""
METADATA = """\
submission_1:
  :submitters:
  - :name: Ada Lovelace
    :sid: '1001'
  - :name: Grace Hopper
    :sid: '1002'
submission_2:
  :submitters:
  - :name: Alan Turing
    :sid: '1003'
submission_3:
  :submitters:
  - :name: Edsger Dijkstra
    :sid: '1004'
submission_4:
  :submitters:
  - :name: Barbara Liskov
    :sid: '1005'
"""
# lab: ten families of weight 1 and the warm-up shape of 1/2; I4's two checks weigh 2 : 1
I4_SHARE = TOTAL / 10.5
MASK_POINTS = I4_SHARE * 2 / 3
ALAN = TOTAL - MASK_POINTS
BUG_WORDS = ("same-source", "same source", "mask", "I4")


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    export = root / "lab7_export.zip"
    with zipfile.ZipFile(export, "w") as zipped:
        zipped.writestr("export/submission_metadata.yml", METADATA)
        zipped.writestr("export/submission_1/moco.py",
                        (SUBMISSIONS / "correct_lab_order.py").read_text())
        zipped.writestr("export/submission_2/moco.py",
                        (SUBMISSIONS / "bug_no_mask.py").read_text())
        zipped.writestr("export/submission_3/report.pdf", b"%PDF-1.4\n%%EOF\n")
        zipped.writestr("export/submission_4/moco.py", "")
    rubric_path = root / "course.toml"
    rubric_path.write_text(RUBRIC)
    out = root / "grades"
    code = main(["grade", str(export), "--rubric", str(rubric_path), "--out", str(out),
                 "-j", "2", "--feedback", "html"])
    assert code == 1  # some students are below full marks
    reports = {}
    for path in sorted(out.glob("submission_*.json")):  # one report per submission
        (data,) = json.loads(path.read_text())["reports"]
        reports[path.stem.split("__")[0]] = SubmissionReport.from_dict(data)
    return {"out": out, "rubric": load_rubric(rubric_path), "reports": reports}


def _csv(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def test_grades_csv_has_every_student_once_out_of_the_rubric_total(course):
    rows = _csv(course["out"] / "grades.csv")
    header, body = rows[0], rows[1:]
    column = {name: index for index, name in enumerate(header)}
    seen = {row[column["student_id"]]: row for row in body}
    assert sorted(seen) == ["1001", "1002", "1003", "1004", "1005"] and len(body) == 5
    for sid in ("1001", "1002"):  # the group: one row each, the same grade
        assert seen[sid][column["score"]] == "50" and seen[sid][column["status"]] == "graded"
    alan = seen["1003"]
    assert float(alan[column["score"]]) == pytest.approx(ALAN, abs=0.01)
    assert float(alan[column["percent"]]) == pytest.approx(
        100 * float(alan[column["score"]]) / TOTAL, abs=0.01)
    assert alan[column["failed_families"]] == "I4"
    for sid, held in (("1004", "report.pdf"), ("1005", "moco.py is empty")):
        row = seen[sid]
        assert row[column["status"]] == "not gradable" and row[column["score"]] == "0"
        assert held in row[column["reason"]]
    assert {row[column["max_score"]] for row in body} == {"50"}


def test_the_canvas_import_file_says_the_points_possible_and_every_student(course):
    rows = _csv(course["out"] / "canvas_import.csv")
    assert rows[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert rows[1][0].strip() == "Points Possible" and rows[1][-1] == "50"
    scores = {row[2]: row[-1] for row in rows[2:]}
    assert sorted(scores) == ["1001", "1002", "1003", "1004", "1005"]
    assert float(scores["1003"]) == pytest.approx(ALAN, abs=0.01)


def test_gradescope_shows_alan_nothing_of_the_hidden_family(course):
    report, rubric = course["reports"]["submission_2"], course["rubric"]
    results = gradescope_results(report, rubric=rubric)
    assert results["score"] == pytest.approx(ALAN, abs=0.01)  # Gradescope hides it itself
    assert sum(test["max_score"] for test in results["tests"]) == pytest.approx(TOTAL)
    shown = [results.get("output", "")] + [
        json.dumps(test) for test in results["tests"] if test.get("visibility") == "visible"]
    for text in shown:
        assert not any(word in text for word in BUG_WORDS), text[:400]
    hidden = [test for test in results["tests"] if "I4" in test.get("name", "")]
    assert hidden and {test["visibility"] for test in hidden} == {"hidden"}
    later = [test for test in results["tests"] if test.get("name", "").startswith("I8")]
    assert later and {test["visibility"] for test in later} == {"after_due_date"}


def test_prairielearn_leaves_the_withheld_checks_out_of_tests_and_score(course):
    report, rubric = course["reports"]["submission_2"], course["rubric"]
    results = prairielearn_results(report, rubric)
    names = " ".join(test["name"] for test in results["tests"])
    assert "I4" not in names and "I8" not in names
    listed = sum(test["max_points"] for test in results["tests"])
    earned = sum(test["points"] for test in results["tests"])
    assert results["gradable"] is True
    assert results["score"] == pytest.approx(earned / listed)
    assert results["score"] == pytest.approx(1.0)  # Alan's only failure is withheld
    assert not any(word in json.dumps(results) for word in ("same-source", "mask"))


def test_feedback_pages_keep_the_withheld_evidence_back(course):
    report, rubric = course["reports"]["submission_2"], course["rubric"]
    page = render_feedback(report, "md", rubric)
    assert not any(word in page for word in ("same-source", "same source"))
    pages = sorted(course["out"].glob("*.feedback.html"))
    assert pages and any("Alan" in page.name for page in pages)
    written = next(page for page in pages if "Alan" in page.name).read_text()
    assert "same-source" not in written


def test_the_class_report_counts_every_gradable_submission(course):
    data = class_report(course["out"])
    bins = data["scores"]["histogram"] if "histogram" in data["scores"] else data["histogram"]
    counted = sum(item["count"] for item in bins)
    gradable = sum(1 for r in course["reports"].values() if r.gradable)
    assert counted == gradable == 2  # the group counts once, and Alan
    assert "gradable" in json.dumps(data["scores"]).lower()
