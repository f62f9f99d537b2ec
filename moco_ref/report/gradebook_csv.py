"""A class's grades as CSV, from a batch's summary rows: ``summary.csv`` for the grader (one
row per submission, its failed checks) and ``grades.csv`` for a learning platform's gradebook
(student, score, percent, status, failed families).

Every text cell goes through ``text.csv_cell`` (names a student chose cannot be read as a
spreadsheet formula) and is quoted; the grader's own numbers are written as numbers."""

from __future__ import annotations

import csv
import io

from moco_ref.report.scoring import points_str
from moco_ref.report.text import csv_cell

SUMMARY_FIELDS = ("submission", "gradable", "score", "max_score", "failed_checks",
                  "wall_seconds", "cached", "style")
GRADEBOOK_FIELDS = ("student_id", "student_name", "submission", "score", "max_score", "percent",
                    "status", "failed_families")


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


def gradebook_csv(rows: list[dict]) -> str:
    """``grades.csv``: one row per submission, for a learning platform's gradebook."""
    buffer = io.StringIO()
    writer = _writer(buffer, GRADEBOOK_FIELDS)
    writer.writeheader()
    for row in rows:
        maximum = row["max_score"] or 0.0
        writer.writerow({
            "student_id": csv_cell(row.get("student_id", "")),
            "student_name": csv_cell(row.get("student_name", "")),
            "submission": csv_cell(row["submission"]),
            "score": _Points(row["score"]),
            "max_score": _Points(maximum),
            "percent": _Points(100 * row["score"] / maximum) if maximum else 0,
            "status": csv_cell(row.get("status", "graded" if row["gradable"]
                                       else "not gradable")),
            "failed_families": csv_cell(_joined(row.get("failed_families"))),
        })
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
