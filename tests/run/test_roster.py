"""Every student of an export has a row: the roster comes from the export's metadata
(Gradescope's ``submission_metadata.yml``, Canvas's file names), not from the files found.
A group submission gives one row per student, a submission with nothing gradable (a PDF, a
text file, an empty file, nothing at all) a not-gradable row with the reason, and each row
says whether the student was late. Two real gradings: a group's correct file and a Canvas
student's late, buggy resubmission."""

from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path

import pytest

from moco_ref.cli import main
from moco_ref.report.class_report import class_report
from moco_ref.run.intake import find_targets
from tests.helpers.conformance_support import SUBMISSIONS

CORRECT = (SUBMISSIONS / "correct_lab_order.py").read_text()
NO_MASK = (SUBMISSIONS / "bug_no_mask.py").read_text()

METADATA = """\
submission_201:
  :submitters:
  - :name: Ada Lovelace
    :sid: '9001'
    :email: ada@example.edu
  - :name: Grace Hopper
    :sid: '9003'
    :email: grace@example.edu
  :created_at: 2026-11-30 10:00:00.000000000 -08:00
submission_202:
  :submitters:
  - :name: Alan Turing
    :sid: '9002'
  :created_at: 2026-12-02 09:30:00.000000000 -08:00
submission_203:
  :submitters:
  - :name: Edsger Dijkstra
    :sid: '9004'
  :late: true
submission_204:
  :submitters:
  - :name: Barbara Liskov
    :sid: '9005'
submission_205:
  :submitters:
  - :name: Donald Knuth
    :sid: '9006'
  :created_at: 2026-11-29 08:00:00.000000000 -08:00
:assignment:
  :title: Lab 7
  :due_date: 2026-12-01 23:59:00.000000000 -08:00
"""
RUBRIC = "total = 50\n"

NO_ENTRY = "a lab submission defines train_moco and moco_warmup, a builder submission a class MoCo"
GRADESCOPE_REASONS = {
    "9002": "no .py file and no .ipynb notebook in the submission (it holds report.pdf)",
    "9004": f"moco.py is empty ({NO_ENTRY})",
    "9005": "nothing was handed in (the export's metadata names this submission; the export "
            "holds no files of it)",
    "9006": "no .py file and no .ipynb notebook in the submission (it holds answers.txt)",
}


def gradescope_export(tmp_path: Path) -> Path:
    """A group of two with a correct file, a PDF-only student (late by ``:created_at:``), an
    empty file (``:late: true``), a student the metadata names but the export holds nothing
    of, and one who handed in a text file."""
    archive = tmp_path / "lab7_export.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("assignment_export/submission_metadata.yml", METADATA)
        zipped.writestr("assignment_export/submission_201/moco.py", CORRECT)
        zipped.writestr("assignment_export/submission_202/report.pdf", b"%PDF-1.4\n%%EOF\n")
        zipped.writestr("assignment_export/submission_203/moco.py", "")
        zipped.writestr("assignment_export/submission_205/answers.txt", "MoCo is neat\n")
    return archive


def canvas_download(tmp_path: Path) -> Path:
    """Ada handed in on time, then a late resubmission (``LATE_``, Canvas's ``-1`` copy
    name); Alan only a PDF; Grace only a text file."""
    folder = tmp_path / "canvas_lab7"
    folder.mkdir()
    (folder / "lovelaceada_9001_500_moco.py").write_text(CORRECT)
    (folder / "lovelaceada_LATE_9001_650_moco-1.py").write_text(NO_MASK)
    (folder / "turingalan_9002_610_report.pdf").write_bytes(b"%PDF-1.4\n%%EOF\n")
    (folder / "hoppergrace_LATE_9003_620_notes.txt").write_text("notes\n")
    return folder


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def read_rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


# --------------------------------------------------------------------------- intake only


def test_the_roster_comes_from_the_metadata_not_from_the_files(tmp_path):
    targets = find_targets([gradescope_export(tmp_path)], tmp_path / "work")
    who = [(t.name, [(s.id, s.name, s.late) for s in t.roster()], bool(t.refused))
           for t in targets]
    assert who == [
        ("submission_201/moco.py", [("9001", "Ada Lovelace", False),
                                    ("9003", "Grace Hopper", False)], False),
        ("submission_202", [("9002", "Alan Turing", True)], True),
        ("submission_203", [("9004", "Edsger Dijkstra", True)], True),
        ("submission_204", [("9005", "Barbara Liskov", None)], True),
        ("submission_205", [("9006", "Donald Knuth", False)], True),
    ]
    for target in targets[1:]:
        assert GRADESCOPE_REASONS[target.roster()[0].id] in target.refused


def test_canvas_students_are_read_from_the_file_names_once_each(tmp_path):
    targets = find_targets([canvas_download(tmp_path)], tmp_path / "work")
    who = [(t.name, [(s.id, s.name, s.late) for s in t.roster()], t.refused)
           for t in targets]
    assert who == [
        ("9001/moco.py", [("9001", "lovelaceada", True)], ""),
        ("9002", [("9002", "turingalan", False)], "9002: not gradable: no .py file and no "
         ".ipynb notebook in the submission (it holds report.pdf)"),
        ("9003", [("9003", "hoppergrace", True)], "9003: not gradable: no .py file and no "
         ".ipynb notebook in the submission (it holds notes.txt)"),
    ]
    assert Path(targets[0].path).read_text() == NO_MASK  # the later, late upload
    assert "latest of 2 submissions (submission 650, late; earlier: 500)" in targets[0].note


@pytest.mark.parametrize(("entry", "late"), [
    (":created_at: 2026-12-02 00:00:01.000000000 -08:00", True),
    (":created_at: 2026-12-01 23:58:59.000000000 -08:00", False),
    (":created_at: '2026-12-02T07:59:00Z'", False),  # 23:59 in -08:00 is 07:59 UTC
    (":created_at: '2026-12-02T08:00:00Z'", True),
    (":late: false", False),
    ("", None),  # the metadata does not say
])
def test_gradescope_lateness_is_what_the_metadata_carries(tmp_path, entry, late):
    folder = tmp_path / "export"
    (folder / "submission_1").mkdir(parents=True)
    (folder / "submission_1" / "moco.py").write_text(CORRECT)
    (folder / "submission_metadata.yml").write_text(
        "submission_1:\n  :submitters:\n  - :name: Ada\n    :sid: '1'\n"
        + (f"  {entry}\n" if entry else "")
        + ":assignment:\n  :due_date: 2026-12-01 23:59:00.000000000 -08:00\n")
    [target] = find_targets([folder], tmp_path / "work")
    assert target.roster()[0].late is late


# --------------------------------------------------------------------------- graded


@pytest.fixture(scope="module")
def gradescope_graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("roster")
    rubric = root / "rubric.toml"
    rubric.write_text(RUBRIC)
    out = root / "out"
    code = main(["grade", str(gradescope_export(root)), "--out", str(out), "--rubric",
                 str(rubric), "--feedback", "html", "-j", "2"])
    assert code == 1  # four students are not gradable
    return out


def test_grades_csv_has_one_row_per_student_with_the_reason(gradescope_graded):
    rows = read_csv(gradescope_graded / "grades.csv")
    assert list(rows[0]) == ["student_id", "student_name", "submission", "late", "score",
                             "max_score", "percent", "status", "reason", "failed_families"]
    shown = [(r["student_id"], r["student_name"], r["submission"], r["late"], r["score"],
              r["max_score"], r["percent"], r["status"], r["failed_families"]) for r in rows]
    assert shown == [
        ("9001", "Ada Lovelace", "submission_201/moco.py", "no", "50", "50", "100", "graded",
         ""),
        ("9003", "Grace Hopper", "submission_201/moco.py", "no", "50", "50", "100", "graded",
         ""),
        ("9002", "Alan Turing", "submission_202", "yes", "0", "50", "0", "not gradable", ""),
        ("9004", "Edsger Dijkstra", "submission_203", "yes", "0", "50", "0", "not gradable",
         ""),
        ("9005", "Barbara Liskov", "submission_204", "", "0", "50", "0", "not gradable", ""),
        ("9006", "Donald Knuth", "submission_205", "no", "0", "50", "0", "not gradable", ""),
    ]
    assert [r["reason"] for r in rows[:2]] == ["", ""]
    assert {r["student_id"]: r["reason"] for r in rows[2:]} == GRADESCOPE_REASONS
    ids = [r["student_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 6  # each student exactly once


def test_the_canvas_import_file_of_a_gradescope_export(gradescope_graded):
    rows = read_rows(gradescope_graded / "canvas_import.csv")
    assert rows == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "lab7_export"],
        ["    Points Possible", "", "", "", "", "50"],
        ["Ada Lovelace", "", "9001", "", "", "50"],
        ["Grace Hopper", "", "9003", "", "", "50"],
        ["Alan Turing", "", "9002", "", "", "0"],
        ["Edsger Dijkstra", "", "9004", "", "", "0"],
        ["Barbara Liskov", "", "9005", "", "", "0"],
        ["Donald Knuth", "", "9006", "", "", "0"],
    ]


def test_names_not_folders_in_the_class_report_and_the_feedback_files(gradescope_graded):
    data = class_report(gradescope_graded)
    assert data["submissions"] == 5 and data["gradable"] == 1 and data["total"] == 50
    assert data["not_gradable"] == ["Alan Turing (9002)", "Edsger Dijkstra (9004)",
                                    "Barbara Liskov (9005)", "Donald Knuth (9006)"]
    assert data["scores"]["by_submission"][0]["who"] == \
        "Ada Lovelace (9001), Grace Hopper (9003)"
    counts = [b["count"] for b in data["scores"]["histogram"]]
    assert counts == [0] * 9 + [1]  # full marks out of 50 are in the last bin
    assert data["scores"]["histogram"][-1]["to_points"] == 50
    assert data["scores"]["mean"] == data["scores"]["median"] == 50
    assert data["scores"]["mean_all"] == 10 and data["scores"]["median_all"] == 0
    assert "the 4 not gradable left out" in data["scores"]["averaged_over"]
    pages = sorted(p.name for p in gradescope_graded.glob("*.feedback.html"))
    assert pages == ["Ada_Lovelace-9001+Grace_Hopper-9003.feedback.html",
                     "Alan_Turing-9002.feedback.html", "Barbara_Liskov-9005.feedback.html",
                     "Donald_Knuth-9006.feedback.html", "Edsger_Dijkstra-9004.feedback.html"]


def test_the_batch_table_and_diff_grades_name_the_students(gradescope_graded, tmp_path,
                                                            capsys):
    from moco_ref.cli.tables import print_verdict_line
    from moco_ref.report.scoring import MinScore
    from moco_ref.run.targets import Student, Target, student_label

    target = Target("x", "submission_9/moco.py", refused="x: not gradable: a link",
                    students=(Student("7", "Ada Lovelace"),))
    print_verdict_line([student_label(target)], 1, MinScore())  # who is below, by name
    table = capsys.readouterr().out
    assert "Ada Lovelace (7)" in table and "submission_9" not in table

    other = tmp_path / "other"
    other.mkdir()
    summary = json.loads((gradescope_graded / "summary.json").read_text())
    summary["submissions"][0]["score"] = 40.0
    (other / "summary.json").write_text(json.dumps(summary))
    assert main(["diff-grades", str(gradescope_graded), str(other)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Ada Lovelace (9001), Grace Hopper (9003): 50 → 40 (")
    assert "submission_201" not in lines[0]


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_canvas_download_with_a_late_resubmission(tmp_path):
    out = tmp_path / "out"
    assert main(["grade", str(canvas_download(tmp_path)), "--out", str(out), "-j", "2"]) == 1
    rows = read_csv(out / "grades.csv")
    shown = [(r["student_id"], r["student_name"], r["late"], r["max_score"], r["status"],
              r["failed_families"]) for r in rows]
    assert shown == [("9001", "lovelaceada", "yes", "100", "graded", "I4"),
                     ("9002", "turingalan", "no", "100", "not gradable", ""),
                     ("9003", "hoppergrace", "yes", "100", "not gradable", "")]
    assert 0 < float(rows[0]["score"]) < 100  # the late resubmission is the graded one
    assert float(rows[0]["percent"]) == float(rows[0]["score"])
    assert [r["score"] for r in rows[1:]] == ["0", "0"]
    assert rows[1]["reason"] == "no .py file and no .ipynb notebook in the submission " \
                                "(it holds report.pdf)"
    assert rows[2]["reason"].endswith("(it holds notes.txt)")
    imported = read_rows(out / "canvas_import.csv")
    assert imported[:2] == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "canvas_lab7"],
        ["    Points Possible", "", "", "", "", "100"]]
    assert imported[2:] == [["lovelaceada", "9001", "", "", "", rows[0]["score"]],
                            ["turingalan", "9002", "", "", "", "0"],
                            ["hoppergrace", "9003", "", "", "", "0"]]
