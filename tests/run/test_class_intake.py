"""A class's submissions as platforms export them (zip, one folder per student, Canvas's
flat download, Gradescope's metadata), and the gradebook out (grades.csv, --only, --merge,
diff-grades)."""

from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path

import pytest

from moco_ref.cli import main
from moco_ref.run.gradebook import diff_grades
from moco_ref.run.intake import find_targets, unpack_zip
from tests.helpers.conformance_support import SUBMISSIONS

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

CORRECT = (SUBMISSIONS / "correct_lab_order.py").read_text()
NO_MASK = (SUBMISSIONS / "bug_no_mask.py").read_text()
METADATA = """\
submission_101:
  :submitters:
  - :name: Ada Lovelace
    :sid: '9001'
  :created_at: 2026-11-30 10:00:00.000000000 -08:00
submission_102:
  :submitters:
  - :name: Alan Turing
    :sid: '9002'
"""


def _gradescope_zip(tmp_path: Path) -> Path:
    """Gradescope's export: one folder per submission, metadata beside them; Ada's main file
    imports a helper module of hers."""
    archive = tmp_path / "export.zip"
    helper_user = CORRECT.replace("import copy\n", "import copy\n\nfrom helpers import TAU\n", 1)
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("assignment_export/submission_metadata.yml", METADATA)
        zipped.writestr("assignment_export/submission_101/moco.py", helper_user)
        zipped.writestr("assignment_export/submission_101/helpers.py", "TAU = 0.2\n")
        zipped.writestr("assignment_export/submission_102/lab07.py", NO_MASK)
    return archive


def test_a_gradescope_export_is_one_submission_per_student_with_names(tmp_path):
    targets = find_targets([_gradescope_zip(tmp_path)], tmp_path / "work")
    assert [(t.name, t.student_id, t.student_name) for t in targets] == [
        ("submission_101/moco.py", "9001", "Ada Lovelace"),
        ("submission_102/lab07.py", "9002", "Alan Turing"),
    ]
    assert "helpers.py" in targets[0].note and not targets[1].note


def test_canvas_s_flat_download_grades_each_student_s_latest_upload(tmp_path):
    folder = tmp_path / "canvas"
    folder.mkdir()
    (folder / "lovelace_9001_500_moco.py").write_text(NO_MASK)
    (folder / "lovelace_9001_650_moco-1.py").write_text(CORRECT)
    (folder / "turing_LATE_9002_600_lab.py").write_text(CORRECT)
    targets = find_targets([folder], tmp_path / "work")
    assert [(t.name, t.student_id, t.student_name) for t in targets] == [
        ("9001/moco.py", "9001", "lovelace"), ("9002/lab.py", "9002", "turing")]
    assert "latest of 2 submissions (submission 650; earlier: 500)" in targets[0].note
    assert Path(targets[0].path).read_text() == CORRECT  # the later upload, under its own name


def test_the_main_file_is_found_by_its_entry_points(tmp_path):
    folder = tmp_path / "class" / "alice"
    folder.mkdir(parents=True)
    (folder / "a_utils.py").write_text("def helper():\n    return 1\n")
    (folder / "solution.py").write_text(CORRECT)
    targets = find_targets([tmp_path / "class"], tmp_path / "work", per_folder=True)
    assert [t.name for t in targets] == ["alice/solution.py"]
    # without per-student folders, a plain folder keeps one submission per file
    assert len(find_targets([tmp_path / "class"], tmp_path / "work")) == 2


@pytest.mark.parametrize("member", ["../evil.py", "/abs.py"])
def test_a_zip_cannot_write_outside_its_folder(tmp_path, member):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr(member, "x = 1\n")
    _, skipped = unpack_zip(archive, tmp_path / "work")  # skipped and flagged, not fatal
    assert len(skipped) == 1 and "was not unpacked" in skipped[0].reason
    assert not (tmp_path / "evil.py").exists()


def test_grades_csv_only_merge_and_diff_grades(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["grade", str(_gradescope_zip(tmp_path)), "--out", str(out), "-j", "2"])
    assert code == 1  # Alan's lacks the mask
    with open(out / "grades.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["student_id"], r["student_name"], r["status"]) for r in rows] == [
        ("9001", "Ada Lovelace", "graded"), ("9002", "Alan Turing", "graded")]
    assert rows[0]["score"] == rows[0]["max_score"] == "100" and rows[0]["percent"] == "100"
    assert rows[1]["failed_families"] == "I4" and float(rows[1]["percent"]) < 100
    report = json.loads(next(out.glob("submission_101*moco.py.json")).read_text())
    assert any("helpers.py" in note for note in report["reports"][0]["notes"])
    capsys.readouterr()

    # --only regrades one student; the other comes from the cache
    code = main(["grade", str(_gradescope_zip(tmp_path)), "--out", str(out), "--only", "9002",
                 "--json"])
    summary = json.loads(capsys.readouterr().out)
    cached = {row["submission"]: row["cached"] for row in summary["submissions"]}
    assert cached == {"submission_101/moco.py": True, "submission_102/lab07.py": False}

    # --merge: two outputs into one; diff-grades: what changed and why
    other = tmp_path / "other"
    other.mkdir()
    edited = json.loads((out / "summary.json").read_text())
    edited["submissions"][1]["score"] = edited["submissions"][1]["max_score"]
    edited["submissions"][1]["failed_checks"] = []
    (other / "summary.json").write_text(json.dumps(edited))
    merged = tmp_path / "merged"
    assert main(["grade", "--merge", str(out), str(other), "--out", str(merged)]) == 0
    assert (merged / "grades.csv").read_text().count("\n") == 3
    changes = diff_grades(out, other)
    assert len(changes) == 1 and changes[0].submission == "submission_102/lab07.py"
    assert "now passed: I4-same-source-masked" in changes[0].why
    assert main(["diff-grades", str(out), str(other)]) == 1
    assert main(["diff-grades", str(out), str(out)]) == 0


def test_bad_gradebook_input_is_one_line(tmp_path, capsys):
    assert main(["diff-grades", str(tmp_path), str(tmp_path)]) == 2
    assert main(["grade", "--merge", str(tmp_path / "nowhere")]) == 2
    assert main(["grade"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("moco-ref: error:") for line in err)


def test_prairielearn_results_from_the_command_line(tmp_path):
    out = tmp_path / "pl.json"
    assert main(["grade", str(SUBMISSIONS / "bug_no_mask.py"), "--prairielearn", str(out),
                 "--brief"]) == 1
    data = json.loads(out.read_text())
    assert data["gradable"] is True and 0 < data["score"] < 1
    assert {"name", "points", "max_points"} <= set(data["tests"][0])
    failed = [t for t in data["tests"] if t["points"] < t["max_points"]]
    assert [t["name"].split(":")[0] for t in failed] == ["I4-same-source-masked"]
    assert "/work" not in out.read_text() and "rerun" not in out.read_text()
