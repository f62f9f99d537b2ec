"""A class's grades as CSV, from a batch's summary rows: ``summary.csv`` for the grader (one
row per submission, its failed checks) and ``grades.csv`` for a learning platform's gradebook
(student, score, percent, status, failed families)."""

from __future__ import annotations

import csv
import io

from moco_ref.report.scoring import points_str

SUMMARY_FIELDS = ("submission", "gradable", "score", "max_score", "failed_checks",
                  "wall_seconds", "cached", "style")
GRADEBOOK_FIELDS = ("student_id", "student_name", "submission", "score", "max_score", "percent",
                    "status", "failed_families")


def gradebook_csv(rows: list[dict]) -> str:
    """``grades.csv``: one row per submission, for a learning platform's gradebook."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=GRADEBOOK_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        maximum = row["max_score"] or 0.0
        writer.writerow({
            "student_id": row.get("student_id", ""), "student_name": row.get("student_name", ""),
            "submission": row["submission"], "score": points_str(row["score"]),
            "max_score": points_str(maximum),
            "percent": points_str(100 * row["score"] / maximum) if maximum else "0",
            "status": row.get("status", "graded" if row["gradable"] else "not gradable"),
            "failed_families": ";".join(row.get("failed_families", [])),
        })
    return buffer.getvalue()


def summary_csv(rows: list[dict]) -> str:
    """``summary.csv``: one row per submission, its failed checks joined by ``;``."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SUMMARY_FIELDS, lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "failed_checks": ";".join(row.get("failed_checks", []))})
    return buffer.getvalue()
