"""A class's grades across runs, read back from the summaries batches wrote: shards merged
into one summary, and what changed between two gradings (after a rubric or a grader
change)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from moco_ref.report.gradebook_csv import row_label
from moco_ref.report.scoring import points_str
from moco_ref.report.text import shown_name
from moco_ref.run.batch import SUMMARY_FORMAT
from moco_ref.run.targets import TargetError


def read_summaries(place: Path) -> list[dict]:
    """The summary files of one output folder (``summary.json`` and every shard's), or the
    one file named; ``TargetError`` (one line) when there is none or one is not a summary."""
    files = [place] if place.is_file() else sorted(place.glob("summary*.json"))
    if not files:
        raise TargetError(f"{place}: no summary.json (or summary-I-of-N.json) to read")
    summaries = []
    for file in files:
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TargetError(f"{file}: not a readable summary ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != SUMMARY_FORMAT or not isinstance(
                data.get("submissions"), list):
            raise TargetError(f"{file}: not a moco-ref grading summary ({SUMMARY_FORMAT})")
        summaries.append(data)
    return summaries


def rows_of(place: Path) -> dict[str, dict]:
    """``{submission: row}`` over every summary of ``place``; a later file wins."""
    rows: dict[str, dict] = {}
    for summary in read_summaries(place):
        for row in summary["submissions"]:
            if isinstance(row, dict) and isinstance(row.get("submission"), str):
                rows[row["submission"]] = row
    return rows


def merge(places: list[Path]) -> tuple[dict, list[str]]:
    """One summary of every submission in ``places`` (shard outputs), and a line for each
    submission graded in more than one of them (the later place wins)."""
    merged: dict[str, dict] = {}
    notes = []
    for place in places:
        for name, row in rows_of(place).items():
            if name in merged:
                notes.append(f"{name}: graded in more than one output; the one in {place} kept")
            merged[name] = row
    first = read_summaries(places[0])[0]
    summary = {
        "format": SUMMARY_FORMAT,
        "grader": first.get("grader"),
        "options": first.get("options"),
        "merged_from": [str(p) for p in places],
        "assignment": first.get("assignment"),
        "total": first.get("total"),
        "submissions": [merged[name] for name in sorted(merged)],
    }
    return summary, notes


@dataclass(frozen=True)
class GradeChange:
    submission: str
    old: float | None  # None: not in the old grading
    new: float | None
    why: str
    who: str = ""  # its students' names and ids (``row_label``); the submission's when none

    def line(self) -> str:
        """One line to print: who (the students' names, else the submission's) and the why
        (check ids read back from the summaries) as ``text.shown_name`` shows names."""
        old = "–" if self.old is None else points_str(self.old)
        new = "–" if self.new is None else points_str(self.new)
        who = shown_name(self.who or self.submission)
        return f"{who}: {old} → {new} ({shown_name(self.why, 4096)})"


def diff_grades(old: Path, new: Path) -> list[GradeChange]:
    """Every submission whose score changed, or that is in only one grading, with why: which
    checks stopped or started failing, or a change of maximum."""
    before, after = rows_of(old), rows_of(new)
    changes = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        who = row_label(b if b is not None else a)
        if a is None or b is None:
            changes.append(GradeChange(name, a and a["score"], b and b["score"],
                                       "only in the new grading" if a is None
                                       else "only in the old grading", who))
            continue
        if abs(a["score"] - b["score"]) <= 1e-9 and abs(a["max_score"] - b["max_score"]) <= 1e-9:
            continue
        now_failing = sorted(set(b["failed_checks"]) - set(a["failed_checks"]))
        now_passing = sorted(set(a["failed_checks"]) - set(b["failed_checks"]))
        reasons = []
        if now_failing:
            reasons.append("now not passed: " + ", ".join(now_failing))
        if now_passing:
            reasons.append("now passed: " + ", ".join(now_passing))
        if abs(a["max_score"] - b["max_score"]) > 1e-9:
            reasons.append(f"maximum {points_str(a['max_score'])} → "
                           f"{points_str(b['max_score'])}")
        if not reasons:
            reasons.append("the same checks, other points (the rubric changed)")
        changes.append(GradeChange(name, a["score"], b["score"], "; ".join(reasons), who))
    return changes
