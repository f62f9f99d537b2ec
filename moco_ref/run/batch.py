"""Grading a class's submissions: a folder in parallel, one report per submission, a summary,
deterministic shards for CI matrices or cluster array jobs, and a cache of unchanged ones.

``grade_folder(paths, options, out=…, jobs=…, shard=(i, n), force=…)``:

- **targets**: every ``*.py``/``*.ipynb`` in the folders (recursively, sorted), files given
  directly, module paths, zips and platform exports (``intake.find_targets``); each has a
  name, which names its report files and decides its shard (``targets``).
- **shards**: ``--shard i/n`` keeps the targets whose name hashes to ``i``
  (``targets.shard_of``).
- **reports**: ``OUT/<name>.json`` (the JSON report), plus one file per writer asked for
  (``report.writers``: ``OUT/<name>.gradescope.json``, ``OUT/<name>.junit.xml``, the
  student's feedback page ``OUT/<student>.feedback.html``, …); ``OUT/summary.csv``,
  ``OUT/grades.csv`` and ``OUT/summary.json`` (submission, score, max score, failed checks,
  wall time, …) for the targets of this run — ``summary-I-of-N.*`` for shard I of N, so
  shards can share a folder.
- **cache**: an unchanged submission is not graded again unless ``force`` (``cache``).
  Reports with a timeout or an internal error are not cached.

Reports are deterministic: the same submission under the same options gives the same report
every time, wall time aside (``comparable``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from moco_ref.judge.results import Status, SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC
from moco_ref.judge.untrusted import clean_text
from moco_ref.probe.options import GradeOptions
from moco_ref.report.gradebook_csv import canvas_import_csv, gradebook_csv, summary_csv
from moco_ref.report.scoring import NOT_PASSED, failed_families
from moco_ref.report.text import dumps_strict
from moco_ref.report.writers import REPORT_WRITERS, Writer, Writing
from moco_ref.run.cache import cache_key, grader_fingerprint, load_cached, store_cached
from moco_ref.run.intake import find_targets
from moco_ref.run.output import DEFAULT_OUT, write_atomic
from moco_ref.run.targets import (
    Target,
    TargetError,
    chosen_by,
    feedback_stem,
    report_stem,
    shard_of,
    student_label,
)

SUMMARY_FORMAT = "moco-ref-batch/1"


@dataclass
class Outcome:
    target: Target
    report: SubmissionReport
    cached: bool = False


@dataclass
class BatchResult:
    outcomes: list[Outcome] = field(default_factory=list)
    skipped_by_shard: int = 0
    not_regraded: int = 0  # --only: submissions neither chosen nor in the cache
    interrupted: bool = False  # Ctrl-C: the summary holds what was graded before
    out: Path | None = None
    wall_seconds: float = 0.0


def comparable(report: SubmissionReport) -> dict:
    """The report without what may change between two gradings of the same submission: the
    wall time and each check's judging time (and nothing else)."""
    data = report.to_dict()
    data.pop("wall_seconds", None)
    for result in data.get("results", ()):
        result.pop("seconds", None)
    return data


# --------------------------------------------------------------------------- files


def _with_target_note(report: SubmissionReport, target: Target) -> SubmissionReport:
    """The target's note (it names the student's files) first, cleaned like every note."""
    note = clean_text(target.note, cap=2_000)
    if note and note not in report.notes:
        report.notes.insert(0, note)
    return report


def refused_report(target: Target) -> SubmissionReport:
    """The not-gradable report of a target the intake refused (``Target.refused``: its main
    file was a link, its archive member could not be unpacked), made without running
    anything: the reason is its traceback, cleaned like every text of a report."""
    report = SubmissionReport(target.path, "unknown", gradable=False,
                              traceback=clean_text(target.refused, cap=4_000))
    return _with_target_note(report, target)


def write_reports(out: Path, outcome: Outcome, writers: Sequence[Writer],
                  writing: Writing) -> None:
    """The files of one report in ``out``: ``<stem>.json`` always (the batch's own record),
    and one file per writer, ``<stem><suffix>`` — a student's page named by its students
    (``feedback_stem``) so that a teacher can hand each student theirs."""
    stem = report_stem(outcome.target)
    for writer in (REPORT_WRITERS["json"], *(w for w in writers if w.name != "json")):
        name = feedback_stem(outcome.target) if writer.named_for_students else stem
        write_atomic(out / f"{name}{writer.suffix}", writer.render(outcome.report, writing))


def summary_rows(outcomes: list[Outcome], total: float | None = None) -> list[dict]:
    """One row per submission. ``max_score``: the report's (the rubric's total for its
    style), or ``total`` (the rubric's) for a submission with no checks (not gradable);
    ``students``: who handed it in (one entry per student of a group), each with ``late``
    (true, false, or null when the export does not say)."""
    rows = []
    for outcome in outcomes:
        report = outcome.report
        roster = outcome.target.roster()
        lateness = {student.late for student in roster} - {None}
        rows.append({
            "submission": outcome.target.name,
            "who": student_label(outcome.target),
            "students": [student.to_dict() for student in roster],
            "late": lateness.pop() if len(lateness) == 1 else None,
            "gradable": report.gradable,
            "score": report.score if report.gradable else 0.0,
            "max_score": report.max_score if report.max_score > 0 or total is None
            else total,
            "failed_checks": [r.check_id for r in report.results if r.status in NOT_PASSED],
            "wall_seconds": round(report.wall_seconds, 3),
            "cached": outcome.cached,
            "style": report.style,
            "student_id": outcome.target.student_id,
            "student_name": outcome.target.student_name,
            "status": grade_status(report),
            "reason": not_gradable_reason(report),
            "failed_families": failed_families(report),
        })
    return rows


def not_gradable_reason(report: SubmissionReport) -> str:
    """Why a submission has no grade of its own, in one line: the intake's refusal or the
    grading's error (the last line of its traceback), the grader's trouble; ``""`` when
    graded."""
    if report.grader_trouble:
        text = report.grader_trouble
    elif report.gradable:
        return ""
    else:
        lines = [line.strip() for line in report.traceback.splitlines() if line.strip()]
        text = lines[-1] if lines else "not gradable"
        text = _REFUSED_PREFIX.sub("", text, count=1)  # the intake's "<name>: not gradable: "
    return clean_text(" ".join(text.split()), cap=300)


_REFUSED_PREFIX = re.compile(r"^[^\n]{0,200}?: not gradable: ")


def rubric_total(options: GradeOptions, rubric=None) -> float:
    """The rubric's total: the course's rubric when given, else the options' (the default's
    when none)."""
    from moco_ref.judge.rubric import Rubric

    return float(rubric.total) if rubric is not None else Rubric.from_pairs(
        options.rubric).total


def assignment_name(paths) -> str:
    """The assignment's name in an import file: the export's (the zip's or the folder's name),
    ``moco-ref`` when it says none."""
    for raw in paths or ():
        name = Path(str(raw)).name
        stem = name[:-4] if name.endswith(".zip") else name
        if stem and stem not in (".", ".."):
            return stem
    return "moco-ref"


def grade_status(report: SubmissionReport) -> str:
    """``grader error`` (the grader's own trouble, twice: for staff, not a grade), ``graded``,
    ``not gradable`` or ``timeout`` (ran out of time, whole or in part)."""
    if report.grader_trouble:
        return "grader error"
    if any(result.status is Status.TIMEOUT for result in report.results) or (
            not report.gradable and "timed out" in report.traceback.lower()):
        return "timeout"
    return "graded" if report.gradable else "not gradable"


def summary_stem(shard: tuple[int, int] | None) -> str:
    """``summary``, or ``summary-2-of-5`` for a shard (shards may share an output folder)."""
    return "summary" if shard is None else f"summary-{shard[0]}-of-{shard[1]}"


def write_summary(out: Path, result: BatchResult, options: GradeOptions, *,
                  shard: tuple[int, int] | None, jobs: int, isolation: str,
                  total: float | None = None, assignment: str = "moco-ref") -> None:
    """``summary.json``/``.csv``, ``grades.csv`` (one row per student) and
    ``canvas_import.csv`` (Canvas's gradebook import format, the assignment's column named
    ``assignment``, out of ``total``: the rubric's)."""
    total = rubric_total(options) if total is None else total
    rows = summary_rows(result.outcomes, total)
    stem = summary_stem(shard)
    write_atomic(out / f"{stem}.csv", summary_csv(rows))
    write_atomic(out / f"{stem.replace('summary', 'grades')}.csv", gradebook_csv(rows))
    write_atomic(out / f"{stem.replace('summary', 'canvas_import')}.csv",
                 canvas_import_csv(rows, assignment, total))
    write_atomic(out / f"{stem}.json", dumps_strict({
        "format": SUMMARY_FORMAT,
        "assignment": assignment,
        "total": total,
        "grader": grader_fingerprint(),
        "options": options.to_dict(),
        "shard": f"{shard[0]}/{shard[1]}" if shard else None,
        "skipped_by_shard": result.skipped_by_shard,
        "jobs": jobs,
        "isolation": isolation,
        "wall_seconds": round(result.wall_seconds, 3),
        "interrupted": result.interrupted,
        "graded": sum(not o.cached for o in result.outcomes),
        "cached": sum(o.cached for o in result.outcomes),
        "submissions": rows,
    }))


def write_merged(out: Path, summary: dict) -> None:
    """A merged summary (``gradebook.merge``) as summary.json, summary.csv, grades.csv and
    canvas_import.csv."""
    out.mkdir(parents=True, exist_ok=True)
    rows = summary["submissions"]
    total = summary.get("total")
    if not isinstance(total, (int, float)) or isinstance(total, bool):
        try:
            total = rubric_total(GradeOptions.from_dict(summary.get("options") or {}))
        except (TypeError, ValueError, KeyError, AttributeError):
            total = rubric_total(GradeOptions())
    write_atomic(out / "summary.csv", summary_csv(rows))
    write_atomic(out / "summary.json", dumps_strict(summary))
    write_atomic(out / "grades.csv", gradebook_csv(rows))
    write_atomic(out / "canvas_import.csv", canvas_import_csv(
        rows, str(summary.get("assignment") or "moco-ref"), float(total)))


# --------------------------------------------------------------------------- the run


def grade_folder(
    paths,
    options: GradeOptions,
    *,
    out: str | Path = DEFAULT_OUT,
    jobs: int = 2,
    shard: tuple[int, int] | None = None,
    force: bool = False,
    writers: Sequence[Writer] = (),
    on_done: Callable[[Outcome], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    per_folder: bool = False,
    only: tuple[str, ...] = (),
    rubric=None,
    isolation: str | None = None,
    assignment: str | None = None,
) -> BatchResult:
    """Grade every submission under ``paths`` (of ``shard``), writing reports and summaries to
    ``out``; ``on_start(total)`` once, ``on_done(outcome)`` as each finishes. ``assignment``
    names the column of ``canvas_import.csv`` (default: the export's name); each report's files
are written by ``writers`` (``report.writers``) beside its JSON."""
    from moco_ref.run.pipeline import grade_tasks
    from moco_ref.sandbox.client import isolation_description

    started = time.monotonic()
    total = rubric_total(options, rubric)
    writing = Writing(options, rubric or DEFAULT_RUBRIC)
    assignment = assignment or assignment_name(paths)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    targets = find_targets(paths, out / ".intake", per_folder=per_folder)
    chosen = {t.name for t in targets if chosen_by(t, only)} if only else None
    if chosen is not None and not chosen:
        raise TargetError(f"--only {' '.join(only)}: no such submission or student id")
    result = BatchResult(out=out)
    if shard is not None:
        kept = [t for t in targets if shard_of(t.name, shard[1]) == shard[0]]
        result.skipped_by_shard = len(targets) - len(kept)
        targets = kept
    if on_start is not None:
        on_start(len(targets))
    outcomes: dict[str, Outcome] = {}
    to_grade: list[tuple[Target, str | None]] = []
    for target in targets:
        if target.refused:  # flagged at intake (a link, a bad member): nothing runs
            outcome = outcomes[target.name] = Outcome(target, refused_report(target))
            write_reports(out, outcome, writers, writing)
            if on_done is not None:
                on_done(outcome)
            continue
        key = cache_key(target, options, isolation)
        regrade = force or (chosen is not None and target.name in chosen)
        cached = None if regrade else load_cached(out, key, target)
        if cached is None and chosen is not None and target.name not in chosen:
            result.not_regraded += 1  # --only: the others come from the cache, or not at all
            continue
        if cached is not None:
            cached = _with_target_note(cached, target)
            outcome = Outcome(target, cached, cached=True)
            outcomes[target.name] = outcome
            write_reports(out, outcome, writers, writing)
            if on_done is not None:
                on_done(outcome)
        else:
            to_grade.append((target, key))
    by_path = {target.path: (target, key) for target, key in to_grade}

    def finished(report: SubmissionReport) -> None:
        target, key = by_path[report.submission]
        report = _with_target_note(report, target)
        outcome = outcomes[target.name] = Outcome(target, report)
        write_reports(out, outcome, writers, writing)
        store_cached(out, key, report)
        if on_done is not None:
            on_done(outcome)

    try:
        reports = grade_tasks([(target.path, options, target.helpers)
                               for target, _ in to_grade], jobs=jobs,
                              on_report=finished, isolation=isolation)
    except KeyboardInterrupt:  # the summary of what was graded before Ctrl-C
        result.outcomes = [outcomes[t.name] for t in targets if t.name in outcomes]
        result.interrupted = True
        result.wall_seconds = time.monotonic() - started
        write_summary(out, result, options, shard=shard, jobs=jobs, isolation="",
                      total=total, assignment=assignment)
        raise
    for (target, _), report in zip(to_grade, reports, strict=True):
        outcomes[target.name] = Outcome(target, report)
    result.outcomes = [outcomes[target.name] for target in targets if target.name in outcomes]
    result.wall_seconds = time.monotonic() - started
    write_summary(out, result, options, shard=shard, jobs=jobs,
                  isolation=isolation_description() if to_grade else "", total=total,
                  assignment=assignment)
    return result
