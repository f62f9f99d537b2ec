"""Grading a class's submissions: a folder in parallel, one report per submission, a summary,
deterministic shards for CI matrices or cluster array jobs, and a cache of unchanged ones.

``grade_folder(paths, options, out=…, jobs=…, shard=(i, n), force=…)``:

- **targets**: every ``*.py``/``*.ipynb`` in the folders (recursively, sorted), files given
  directly, module paths. Each has a *name*: its path relative to the folder it was found in
  (or its file name / module path), which names its report files and decides its shard.
- **shards**: ``--shard i/n`` keeps the targets whose name hashes to ``i`` (``sha256`` of the
  name, mod ``n``; 1-based ``i``): stable across machines, Python versions and reorderings,
  and every target lands in exactly one shard.
- **reports**: ``OUT/<name>.json`` (the JSON report), plus ``OUT/<name>.gradescope.json``,
  ``OUT/<name>.junit.xml`` and the student's feedback page ``OUT/<name>.feedback.html`` (or
  ``.md``) when asked; ``OUT/summary.csv`` and ``OUT/summary.json`` (submission,
  score, max score, failed checks, wall time, …) for the targets of this run —
  ``summary-I-of-N.*`` for shard I of N, so shards can share a folder.
- **cache**: ``OUT/.cache/<key>.json``, ``key = sha256(name, content of the file, grader
  fingerprint, options)`` (the name too: a report quotes its file in tracebacks), each entry
  authenticated by an HMAC-SHA256 under ``OUT/.cache/.secret`` (owner-only): an entry without
  a valid MAC, or whose report was changed, is ignored and the submission graded anew. An unchanged
  submission is not graded again unless ``force``; the grader fingerprint is the version plus
  a hash of the grader's own source, so any change of the grader invalidates the cache.
  Reports with a timeout or an internal error are not cached. Module targets are always
  graded (no file to hash).

Reports are deterministic: the same submission under the same options gives the same report
every time, wall time aside (``comparable``).
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import moco_ref
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.observe.loader import (
    SUBMISSION_SUFFIXES,
    TargetError,
    expand_targets,
    is_module_target,
)
from moco_ref.observe.options import GradeOptions
from moco_ref.report.scoring import NOT_PASSED, failed_families, points_str

DEFAULT_OUT = "grading-reports"
CACHE_FOLDER = ".cache"
SECRET_FILE = ".secret"
SUMMARY_FIELDS = ("submission", "gradable", "score", "max_score", "failed_checks",
                  "wall_seconds", "cached", "style")
_SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", ".git", ".hypothesis"}
_SKIPPED_FILES = {"conftest.py", "setup.py"}


@dataclass(frozen=True)
class Target:
    path: str  # what is graded: a file path or a module path
    name: str  # stable identifier: relative path (or module path); names the report files
    student_id: str = ""  # from the platform's export, when it says
    student_name: str = ""
    note: str = ""  # how the file was chosen (latest of several, helper modules beside it)


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


# --------------------------------------------------------------------------- targets


def find_targets(paths, workdir: Path | None = None, *, per_folder: bool = False
                 ) -> list[Target]:
    """Submissions under ``paths``: a ``.zip`` is unpacked into ``workdir`` and read as a
    folder; a platform's export (one folder per student, Canvas's flat download) gives one
    submission per student (``intake``); other folders are searched recursively (hidden,
    private and test-config files left out, as ``expand_targets`` does for one level)."""
    from moco_ref.report.intake import class_submissions, unpack_zip

    targets: list[Target] = []
    seen: set[str] = set()
    workdir = workdir or Path(DEFAULT_OUT) / ".intake"
    for raw in paths:
        path = Path(str(raw))
        from_zip = path.suffix == ".zip" and path.is_file()
        if from_zip:
            path = unpack_zip(path, workdir / "unpacked")
        students = class_submissions(path, workdir, per_folder=per_folder or from_zip) \
            if path.is_dir() else None
        if students:
            targets.extend(Target(str(s.path), s.name, s.student_id, s.student_name, s.note)
                           for s in students)
        elif path.is_dir():
            found = []
            for file in sorted(path.rglob("*")):
                relative = file.relative_to(path)
                if any(part.startswith(".") or part in _SKIPPED_DIRS
                       for part in relative.parts[:-1]):
                    continue
                if (file.is_file() and file.suffix in SUBMISSION_SUFFIXES
                        and not file.name.startswith(("_", "."))
                        and file.name not in _SKIPPED_FILES):
                    found.append(Target(str(file), relative.as_posix()))
            if not found:
                raise TargetError(f"no submissions (*.py or *.ipynb files) in folder {path}")
            targets.extend(found)
        else:
            for target in expand_targets([raw]):
                name = target if is_module_target(target) else Path(target).name
                targets.append(Target(target, name))
    unique = []
    for target in targets:
        if target.name in seen:
            raise TargetError(f"two submissions are both named {target.name!r}; grade them "
                              "from separate folders or in separate runs")
        seen.add(target.name)
        unique.append(target)
    return unique


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/5"`` → ``(2, 5)``; 1-based."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard wants i/n (e.g. 2/5), got {text!r}") from None
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--shard {text}: need 1 ≤ i ≤ n")
    return index, count


def shard_of(name: str, count: int) -> int:
    """The 1-based shard a target's name falls in."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


# --------------------------------------------------------------------------- cache keys


@lru_cache(maxsize=1)
def grader_fingerprint() -> str:
    """The version and a hash of every source file of the grader (moco_ref)."""
    root = Path(moco_ref.__file__).resolve().parent
    digest = hashlib.sha256(moco_ref.__version__.encode())
    for file in sorted(root.rglob("*.py")):
        digest.update(file.relative_to(root).as_posix().encode())
        digest.update(file.read_bytes())
    return f"{moco_ref.__version__}+{digest.hexdigest()[:16]}"


def cache_key(target: Target, options: GradeOptions) -> str | None:
    """None when the target cannot be hashed (a module path)."""
    if is_module_target(target.path):
        return None
    from moco_ref.sandbox.attempt import helper_files
    from moco_ref.sandbox.client import isolation_mode

    content = hashlib.sha256(Path(target.path).read_bytes()).hexdigest()
    helpers = {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
               for path in helper_files(target.path)}
    material = json.dumps({"name": target.name, "content": content, "helpers": helpers,
                           "grader": grader_fingerprint(), "options": options.to_dict(),
                           "isolation": isolation_mode()}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def _cache_file(out: Path, key: str) -> Path:
    return out / CACHE_FOLDER / f"{key}.json"


def _secret(out: Path) -> bytes:
    """The cache's signing key, ``OUT/.cache/.secret`` (created on first use, owner-only): a
    cache entry is trusted only if it carries this key's MAC, so an entry written by anyone
    who cannot read the key (a submission) is never believed."""
    path = out / CACHE_FOLDER / SECRET_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = secrets.token_bytes(32)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another grading run made it first
            return path.read_bytes()
        with os.fdopen(descriptor, "wb") as file:
            file.write(fresh)
        return fresh


def _mac(secret: bytes, key: str, report: dict) -> str:
    body = json.dumps({"key": key, "report": report}, sort_keys=True).encode()
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def load_cached(out: Path, key: str | None, target: Target) -> SubmissionReport | None:
    """The cached report of ``key`` if there is one whose MAC this grader wrote."""
    if key is None:
        return None
    try:
        data = json.loads(_cache_file(out, key).read_text(encoding="utf-8"))
        if data.get("key") != key or not isinstance(data.get("mac"), str):
            return None
        if not hmac.compare_digest(data["mac"], _mac(_secret(out), key, data["report"])):
            return None
        report = report_from_dict(data["report"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    report.submission = target.path
    return report


def store_cached(out: Path, key: str | None, report: SubmissionReport) -> None:
    if key is None or not report_is_cacheable(report):
        return
    data = json.loads(_dumps(report.to_dict()))  # the report exactly as it will be read back
    _write_atomic(_cache_file(out, key),
                  _dumps({"key": key, "report": data, "mac": _mac(_secret(out), key, data)}))


def report_is_cacheable(report: SubmissionReport) -> bool:
    """Timeouts and internal errors may not happen again: those reports are not kept."""
    if "moco-ref internal error" in report.traceback:
        return False
    return not any(result.status is Status.TIMEOUT for result in report.results) and \
        "timed out after" not in report.traceback


def report_from_dict(data: dict) -> SubmissionReport:
    results = [
        CheckResult(item["check_id"], item["title"], item["family"], float(item["max_points"]),
                    Status(item["status"]), item.get("message", ""), dict(item.get("details")
                                                                           or {}))
        for item in data.get("results", [])
    ]
    return SubmissionReport(
        submission=data["submission"], style=data["style"], gradable=bool(data["gradable"]),
        results=results, inferred=dict(data.get("inferred") or {}),
        notes=list(data.get("notes") or []), traceback=data.get("traceback", ""),
        stdout=data.get("stdout", ""), stderr=data.get("stderr", ""),
        wall_seconds=float(data.get("wall_seconds", 0.0)),
        isolation=str(data.get("isolation", "")),
    )


def comparable(report: SubmissionReport) -> dict:
    """The report without what may change between two gradings of the same submission: the
    wall time (and nothing else)."""
    data = report.to_dict()
    data.pop("wall_seconds", None)
    return data


# --------------------------------------------------------------------------- files


def report_stem(target: Target) -> str:
    """``sub/alice.py`` → ``sub__alice.py``: one flat folder of reports."""
    return target.name.replace("/", "__").replace("\\", "__")


def _dumps(payload) -> str:
    from moco_ref.report.formats import dumps_strict

    return dumps_strict(payload)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def chosen_by(target: Target, only) -> bool:
    """Whether ``--only`` names this submission: its name, file stem, folder or student id."""
    names = {target.name, Path(target.name).stem, target.name.split("/", 1)[0]}
    names |= set(target.student_id.split(";")) - {""}
    return bool(names & set(only))


def _with_target_note(report: SubmissionReport, target: Target) -> SubmissionReport:
    if target.note and target.note not in report.notes:
        report.notes.insert(0, target.note)
    return report


def write_reports(out: Path, outcome: Outcome, options: GradeOptions, *,
                  gradescope: bool = False, junit: bool = False, rubric=None,
                  feedback: str | None = None) -> None:
    """``<stem>.json``, and when asked ``<stem>.gradescope.json``, ``<stem>.junit.xml`` and
    the student's feedback page ``<stem>.feedback.html`` / ``.md`` (``feedback``)."""
    from moco_ref.report.formats import gradescope_results, junit_tree, to_json

    stem = report_stem(outcome.target)
    _write_atomic(out / f"{stem}.json", to_json([outcome.report], options))
    if feedback:
        from moco_ref.report.feedback import SUFFIXES, render_feedback

        _write_atomic(out / f"{stem}{SUFFIXES[feedback]}",
                      render_feedback(outcome.report, feedback, rubric))
    if gradescope:
        _write_atomic(out / f"{stem}.gradescope.json",
                      _dumps(gradescope_results(outcome.report, options, rubric)))
    if junit:
        import xml.etree.ElementTree as ET

        tree = junit_tree([outcome.report], options)
        ET.indent(tree)
        buffer = io.BytesIO()
        tree.write(buffer, encoding="utf-8", xml_declaration=True)
        _write_atomic(out / f"{stem}.junit.xml", buffer.getvalue().decode("utf-8"))


def summary_rows(outcomes: list[Outcome]) -> list[dict]:
    rows = []
    for outcome in outcomes:
        report = outcome.report
        rows.append({
            "submission": outcome.target.name,
            "gradable": report.gradable,
            "score": report.score if report.gradable else 0.0,
            "max_score": report.max_score,
            "failed_checks": [r.check_id for r in report.results if r.status in NOT_PASSED],
            "wall_seconds": round(report.wall_seconds, 3),
            "cached": outcome.cached,
            "style": report.style,
            "student_id": outcome.target.student_id,
            "student_name": outcome.target.student_name,
            "status": grade_status(report),
            "failed_families": failed_families(report),
        })
    return rows


def grade_status(report: SubmissionReport) -> str:
    """``graded``, ``not gradable`` or ``timeout`` (ran out of time, whole or in part)."""
    if any(result.status is Status.TIMEOUT for result in report.results) or (
            not report.gradable and "timed out" in report.traceback.lower()):
        return "timeout"
    return "graded" if report.gradable else "not gradable"


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


def summary_stem(shard: tuple[int, int] | None) -> str:
    """``summary``, or ``summary-2-of-5`` for a shard (shards may share an output folder)."""
    return "summary" if shard is None else f"summary-{shard[0]}-of-{shard[1]}"


def summary_csv(rows: list[dict]) -> str:
    """``summary.csv``: one row per submission, its failed checks joined by ``;``."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SUMMARY_FIELDS, lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "failed_checks": ";".join(row.get("failed_checks", []))})
    return buffer.getvalue()


def write_summary(out: Path, result: BatchResult, options: GradeOptions, *,
                  shard: tuple[int, int] | None, jobs: int, isolation: str) -> None:
    rows = summary_rows(result.outcomes)
    stem = summary_stem(shard)
    _write_atomic(out / f"{stem}.csv", summary_csv(rows))
    _write_atomic(out / f"{stem.replace('summary', 'grades')}.csv", gradebook_csv(rows))
    _write_atomic(out / f"{stem}.json", _dumps({
        "format": "moco-ref-batch/1",
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
    """A merged summary (``gradebook.merge``) as summary.json, summary.csv and grades.csv."""
    out.mkdir(parents=True, exist_ok=True)
    rows = summary["submissions"]
    _write_atomic(out / "summary.csv", summary_csv(rows))
    _write_atomic(out / "summary.json", _dumps(summary))
    _write_atomic(out / "grades.csv", gradebook_csv(rows))


# --------------------------------------------------------------------------- the run


def grade_folder(
    paths,
    options: GradeOptions,
    *,
    out: str | Path = DEFAULT_OUT,
    jobs: int = 2,
    shard: tuple[int, int] | None = None,
    force: bool = False,
    gradescope: bool = False,
    junit: bool = False,
    on_done: Callable[[Outcome], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    per_folder: bool = False,
    only: tuple[str, ...] = (),
    rubric=None,
    feedback: str | None = None,
) -> BatchResult:
    """Grade every submission under ``paths`` (of ``shard``), writing reports and summaries to
    ``out``; ``on_start(total)`` once, ``on_done(outcome)`` as each finishes."""
    from moco_ref.grade import grade_tasks
    from moco_ref.sandbox.client import isolation_description

    started = time.monotonic()
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
        key = cache_key(target, options)
        regrade = force or (chosen is not None and target.name in chosen)
        cached = None if regrade else load_cached(out, key, target)
        if cached is None and chosen is not None and target.name not in chosen:
            result.not_regraded += 1  # --only: the others come from the cache, or not at all
            continue
        if cached is not None:
            cached = _with_target_note(cached, target)
            outcome = Outcome(target, cached, cached=True)
            outcomes[target.name] = outcome
            write_reports(out, outcome, options, gradescope=gradescope, junit=junit,
                          rubric=rubric, feedback=feedback)
            if on_done is not None:
                on_done(outcome)
        else:
            to_grade.append((target, key))
    by_path = {target.path: (target, key) for target, key in to_grade}

    def finished(report: SubmissionReport) -> None:
        target, key = by_path[report.submission]
        report = _with_target_note(report, target)
        outcome = outcomes[target.name] = Outcome(target, report)
        write_reports(out, outcome, options, gradescope=gradescope, junit=junit,
                      rubric=rubric, feedback=feedback)
        store_cached(out, key, report)
        if on_done is not None:
            on_done(outcome)

    try:
        reports = grade_tasks([(target.path, options) for target, _ in to_grade], jobs=jobs,
                              on_report=finished)
    except KeyboardInterrupt:  # the summary of what was graded before Ctrl-C
        result.outcomes = [outcomes[t.name] for t in targets if t.name in outcomes]
        result.interrupted = True
        result.wall_seconds = time.monotonic() - started
        write_summary(out, result, options, shard=shard, jobs=jobs, isolation="")
        raise
    for (target, _), report in zip(to_grade, reports, strict=True):
        outcomes[target.name] = Outcome(target, report)
    result.outcomes = [outcomes[target.name] for target in targets if target.name in outcomes]
    result.wall_seconds = time.monotonic() - started
    write_summary(out, result, options, shard=shard, jobs=jobs,
                  isolation=isolation_description() if to_grade else "")
    return result


# --------------------------------------------------------------------------- progress


class Progress:
    """A progress bar on stderr (rich when it is a terminal; one line per submission
    otherwise, which reads well in CI logs)."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.total = 0
        self.done = 0
        self._rich = None
        self._task = None

    def start(self, total: int) -> None:
        self.total = total
        if self.stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )
                from rich.progress import Progress as RichProgress
            except ImportError:
                return
            self._rich = RichProgress(
                TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), TextColumn("{task.description}"),
                console=Console(file=self.stream), transient=False,
            )
            self._rich.start()
            self._task = self._rich.add_task("", total=total)

    def advance(self, outcome: Outcome) -> None:
        self.done += 1
        report = outcome.report
        verdict = "not gradable" if not report.gradable else \
            f"{points_str(report.score)}/{points_str(report.max_score)}"
        suffix = " (cached)" if outcome.cached else ""
        if self._rich is not None:
            self._rich.update(self._task, advance=1,
                              description=f"{outcome.target.name}: {verdict}{suffix}")
        else:
            print(f"[{self.done}/{self.total}] {outcome.target.name}: {verdict}{suffix}",
                  file=self.stream, flush=True)

    def stop(self) -> None:
        if self._rich is not None:
            self._rich.stop()
