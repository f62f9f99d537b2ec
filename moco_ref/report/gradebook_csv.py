"""A class's grades as CSV, from a batch's summary rows: ``summary.csv`` for the grader (one
row per submission, its failed checks), ``grades.csv`` for a learning platform's gradebook
(one row per student: id, name, late, score, maximum, percent, status, reason, failed
families) and ``canvas_import.csv`` in Canvas's gradebook import format.

Every text cell goes through ``text.csv_cell`` (names a student chose cannot be read as a
spreadsheet formula) and is quoted; the grader's own numbers are written as numbers."""

from __future__ import annotations

import csv
import io

from moco_ref.report.scoring import points_str
from moco_ref.report.text import csv_cell

SUMMARY_FIELDS = ("submission", "gradable", "score", "max_score", "failed_checks",
                  "wall_seconds", "cached", "style")
GRADEBOOK_FIELDS = ("student_id", "student_name", "submission", "late", "score", "max_score",
                    "percent", "status", "reason", "failed_families")


class _Points(float):
    """Points as a number cell (unquoted), written as ``points_str`` writes them."""

    def __str__(self) -> str:
        return points_str(self)


def _writer(buffer: io.StringIO, fields: tuple[str, ...]) -> csv.DictWriter:
    # QUOTE_NONNUMERIC: every text cell quoted (a ``,`` or ``;`` inside starts no cell), the
    # numbers (int, float, bool) not.
    return csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n",
                          quoting=csv.QUOTE_NONNUMERIC, extrasaction="ignore")


def _joined(values) -> str:
    return ";".join(str(value) for value in values or ())


def row_label(row: dict) -> str:
    """Who a summary row is: its students' names (with their ids), ``, ``-joined for a
    group; the submission's name when the export named no one (``who``, or built from
    ``students`` for a summary written before it)."""
    if row.get("who"):
        return str(row["who"])
    labels = []
    for student in _students(row):
        name, ident = student["name"], student["id"]
        labels.append(f"{name} ({ident})" if name and ident else name or ident)
    return ", ".join(label for label in labels if label) or str(row.get("submission", ""))


def _students(row: dict) -> list[dict]:
    """The row's students (``{"id", "name", "late", "platform"}``): its ``students``, else
    one from ``student_id``/``student_name``, else one without id or name."""
    found = [s for s in row.get("students") or () if isinstance(s, dict)]
    if found:
        return [{"id": str(s.get("id") or ""), "name": str(s.get("name") or ""),
                 "late": s.get("late"), "platform": str(s.get("platform") or "")}
                for s in found]
    return [{"id": str(row.get("student_id") or ""), "name": str(row.get("student_name") or ""),
             "late": row.get("late"), "platform": ""}]


def _late(value) -> str:
    return {True: "yes", False: "no"}.get(value, "")


def _status(row: dict) -> str:
    return str(row.get("status") or ("graded" if row.get("gradable") else "not gradable"))


def _maximum(row: dict, total: float | None = None) -> float:
    maximum = float(row.get("max_score") or 0.0)
    return maximum if maximum > 0 or total is None else float(total)


def gradebook_csv(rows: list[dict]) -> str:
    """``grades.csv``: one row per student (a group submission gives each of its students
    a row of its grade), for a learning platform's gradebook. ``late``: ``yes``/``no``, empty
    when the export does not say; ``max_score``: the rubric's total, also for a submission
    that is not gradable (score 0, ``reason`` says why)."""
    buffer = io.StringIO()
    writer = _writer(buffer, GRADEBOOK_FIELDS)
    writer.writeheader()
    for row in rows:
        maximum = _maximum(row)
        score = float(row.get("score") or 0.0)
        for student in _students(row):
            writer.writerow({
                "student_id": csv_cell(student["id"]),
                "student_name": csv_cell(student["name"]),
                "submission": csv_cell(row["submission"]),
                "late": csv_cell(_late(student["late"])),
                "score": _Points(score),
                "max_score": _Points(maximum),
                "percent": _Points(100 * score / maximum) if maximum else 0,
                "status": csv_cell(_status(row)),
                "reason": csv_cell(row.get("reason", "")),
                "failed_families": csv_cell(_joined(row.get("failed_families"))),
            })
    return buffer.getvalue()


CANVAS_FIELDS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
CANVAS_POINTS_POSSIBLE = "    Points Possible"  # as Canvas's own gradebook export writes it


def canvas_import_csv(rows: list[dict], assignment: str, total: float) -> str:
    """``canvas_import.csv``: Canvas's gradebook import format — ``Student``, ``ID``, ``SIS
    User ID``, ``SIS Login ID``, ``Section`` and one column named ``assignment``; its second
    line the ``Points Possible`` row (``total``, the rubric's), then one row per student. A
    Canvas download's id (Canvas's user id) goes in ``ID``, any other (Gradescope's SID, a
    teacher's) in ``SIS User ID``: Canvas matches a student by either. A submission that is
    not gradable scores 0; one the grader itself failed on (``grader error``, not a grade)
    is left empty, which Canvas's import leaves unchanged."""
    column = csv_cell(assignment) or "moco-ref"
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    writer.writerow([*CANVAS_FIELDS, column])
    writer.writerow([CANVAS_POINTS_POSSIBLE, "", "", "", "", _Points(total)])
    for row in rows:
        score = "" if _status(row) == "grader error" else _Points(
            float(row.get("score") or 0.0) if row.get("gradable") else 0.0)
        for student in _students(row):
            canvas = student["platform"] == "canvas"
            writer.writerow([csv_cell(student["name"] or row_label(row)),
                             csv_cell(student["id"]) if canvas else "",
                             "" if canvas else csv_cell(student["id"]), "", "", score])
    return buffer.getvalue()


def summary_csv(rows: list[dict]) -> str:
    """``summary.csv``: one row per submission, its failed checks joined by ``;``."""
    buffer = io.StringIO()
    writer = _writer(buffer, SUMMARY_FIELDS)
    writer.writeheader()
    for row in rows:
        cells = {**row, "failed_checks": _joined(row.get("failed_checks"))}
        writer.writerow({field: csv_cell(cells.get(field)) for field in SUMMARY_FIELDS})
    return buffer.getvalue()
