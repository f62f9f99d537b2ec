"""The gradebook files a teacher imports, and the class report's numbers, from summary rows
written by hand (nothing is graded here): grades.csv one row per student, canvas_import.csv
in Canvas's gradebook import format, a histogram that holds every gradable submission
whatever the rubric's total, and a mean and median that say what they count."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from moco_ref.report.class_report import class_report, class_report_html
from moco_ref.report.gradebook_csv import canvas_import_csv, gradebook_csv, row_label
from moco_ref.run.batch import SUMMARY_FORMAT, write_merged


def _row(submission, score, *, students=(), gradable=True, status=None, maximum=50.0,
         reason="", families=()):
    return {"submission": submission, "gradable": gradable, "score": score,
            "max_score": maximum, "failed_checks": [f"{f}-x" for f in families],
            "students": [{"id": i, "name": n, "late": late, "platform": platform}
                         for i, n, late, platform in students],
            "status": status or ("graded" if gradable else "not gradable"),
            "reason": reason, "failed_families": list(families), "wall_seconds": 1.0,
            "cached": False, "style": "lab"}


ROWS = [
    _row("submission_1/moco.py", 50.0, students=[("9001", "Ada Lovelace", False, "gradescope"),
                                                 ("9003", "Grace Hopper", False, "gradescope")]),
    _row("submission_2", 0.0, students=[("9002", "Alan Turing", True, "gradescope")],
         gradable=False, reason="no .py file (it holds report.pdf)"),
    _row("9010/lab.py", 37.5, students=[("9010", "lovelaceada", True, "canvas")],
         families=["I4"]),
    _row("submission_4/moco.py", 0.0, students=[("9011", "=cmd|' /C calc'!A0", None, "")],
         gradable=False, status="grader error", reason="its warm process died"),
    {"submission": "bob.py", "gradable": True, "score": 12.5, "max_score": 50.0,
     "status": "graded", "failed_families": ["I7"], "student_id": "", "student_name": ""},
]


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_grades_csv_is_one_row_per_student():
    rows = list(csv.DictReader(io.StringIO(gradebook_csv(ROWS))))
    shown = [(r["student_id"], r["student_name"], r["submission"], r["late"], r["score"],
              r["max_score"], r["percent"], r["status"], r["reason"], r["failed_families"])
             for r in rows]
    assert shown == [
        ("9001", "Ada Lovelace", "submission_1/moco.py", "no", "50", "50", "100", "graded", "",
         ""),
        ("9003", "Grace Hopper", "submission_1/moco.py", "no", "50", "50", "100", "graded", "",
         ""),
        ("9002", "Alan Turing", "submission_2", "yes", "0", "50", "0", "not gradable",
         "no .py file (it holds report.pdf)", ""),
        ("9010", "lovelaceada", "9010/lab.py", "yes", "37.5", "50", "75", "graded", "", "I4"),
        ("9011", "'=cmd|' /C calc'!A0", "submission_4/moco.py", "", "0", "50", "0",
         "grader error", "its warm process died", ""),
        ("", "", "bob.py", "", "12.5", "50", "25", "graded", "", "I7"),
    ]


def test_canvas_import_has_the_points_possible_row_and_each_student():
    lines = _csv(canvas_import_csv(ROWS, "Lab 7: MoCo", 50.0))
    assert lines == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 7: MoCo"],
        ["    Points Possible", "", "", "", "", "50"],
        ["Ada Lovelace", "", "9001", "", "", "50"],  # Gradescope's SID: the SIS id
        ["Grace Hopper", "", "9003", "", "", "50"],
        ["Alan Turing", "", "9002", "", "", "0"],  # not gradable: 0
        ["lovelaceada", "9010", "", "", "", "37.5"],  # Canvas's own user id
        ["'=cmd|' /C calc'!A0", "", "9011", "", "", ""],  # the grader's error is no grade
        ["bob.py", "", "", "", "", "12.5"],
    ]


def test_a_merged_output_gets_its_canvas_import_too(tmp_path):
    summary = {"format": SUMMARY_FORMAT, "options": {}, "assignment": "lab7", "total": 50.0,
               "submissions": ROWS[:2]}
    write_merged(tmp_path, summary)
    lines = _csv((tmp_path / "canvas_import.csv").read_text())
    assert lines[0][-1] == "lab7" and lines[1][-1] == "50" and len(lines) == 5
    assert (tmp_path / "grades.csv").read_text().count("\n") == 4


def test_row_labels_name_the_students():
    assert row_label(ROWS[0]) == "Ada Lovelace (9001), Grace Hopper (9003)"
    assert row_label(ROWS[4]) == "bob.py"
    assert row_label({"submission": "x", "student_id": "7", "student_name": ""}) == "7"


def _summary(folder: Path, rows: list[dict], **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(
        {"format": SUMMARY_FORMAT, "submissions": rows, **extra}), encoding="utf-8")
    return folder


def test_the_histogram_holds_every_gradable_submission_whatever_the_total(tmp_path):
    # a rubric out of 50 (and one out of 33.33): full marks, with the float noise a sum of
    # points may carry, are in the last bin, closed at the top
    rows = [_row(f"s{i}.py", score, maximum=maximum) for i, (score, maximum) in enumerate([
        (50.0, 50.0), (50.000000000000014, 50.0), (33.33, 33.33), (49.99, 50.0),
        (45.0, 50.0), (4.99, 50.0), (0.0, 50.0)])]
    rows.append(_row("s9", 0.0, gradable=False))
    data = class_report(_summary(tmp_path / "out", rows, total=50.0))
    counts = [b["count"] for b in data["scores"]["histogram"]]
    assert counts == [2, 0, 0, 0, 0, 0, 0, 0, 0, 5]
    assert sum(counts) == data["gradable"] == 7
    assert [(b["from_points"], b["to_points"]) for b in data["scores"]["histogram"]][-2:] == \
        [(40.0, 45.0), (45.0, 50.0)]


def test_mean_and_median_say_what_they_count(tmp_path):
    rows = [_row("a.py", 40.0), _row("b.py", 30.0), _row("c.py", 20.0),
            _row("d", 0.0, gradable=False), _row("e", 0.0, gradable=False)]
    data = class_report(_summary(tmp_path / "out", rows, total=50.0))
    scores = data["scores"]
    assert (scores["mean"], scores["median"]) == (30.0, 30.0)  # the gradable ones
    assert (scores["mean_all"], scores["median_all"]) == (18.0, 20.0)  # not gradable as 0
    assert scores["averaged_over"] == ("over the 3 gradable submission(s); the 2 not gradable "
                                       "left out (counted as 0: see mean_all, median_all)")
    text = class_report_html(data, draw=False)
    assert "mean score 30, median 30 over the 3 gradable submission(s); the 2 not gradable " \
           "left out" in text
    assert "counting the not gradable as 0: mean 18, median 20" in text
    assert data["not_gradable"] == ["d", "e"]

    every = class_report(_summary(tmp_path / "all", rows[:3]))
    assert every["scores"]["averaged_over"] == "over all 3 submission(s), every one gradable"
    assert "counting the not gradable" not in class_report_html(every, draw=False)
