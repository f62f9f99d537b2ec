"""Grading a submission in isolation: the submission's process observes, this process judges.

Each submission runs in a child process (``python -m moco_ref.grading.worker``) that has

- its own session and process group, killed as a whole when grading ends;
- a wall-clock timeout (``GradeOptions.timeout``) and an address-space limit
  (``RLIMIT_AS = GradeOptions.memory_mb``; torch alone maps ~3.4 GB of it here);
- a fresh, empty temporary working directory, removed afterwards;
- no standard input, and its stdout/stderr captured, keeping the first and last 10 kB each;
- no core dumps, and no file larger than 1 GiB.

The child hands back a record of plain data, read with ``torch.load(weights_only=True)`` (no
code is unpickled), and ``judge`` runs here. A submission that cannot be imported, exits or
crashes before any observation, or times out while loading, gives a report with
``gradable=False`` and the traceback; it never raises out of ``grade_submission``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

import moco_ref
from moco_ref.conformance.options import GradeOptions
from moco_ref.conformance.results import CheckResult, Status, SubmissionReport
from moco_ref.grading.capture import StreamDrain
from moco_ref.grading.loader import is_module_target
from moco_ref.grading.worker import PROGRESS_FILE_NAME

RECORD_FILE_NAME = "observations.pt"
MAX_FILE_BYTES = 2**30  # no file the submission writes may grow past 1 GiB (SIGXFSZ)
_PACKAGE_ROOT = str(Path(moco_ref.__file__).resolve().parent.parent)
_JUDGE_LOCK = threading.Lock()  # judging is quick; one at a time keeps hypothesis & torch calm


def grade_submission(target: str, options: GradeOptions | None = None) -> SubmissionReport:
    """Observe ``target`` in a child process, judge the observations here, and report."""
    options = options or GradeOptions()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(
            prefix="moco-ref-grade-", ignore_cleanup_errors=True
        ) as scratch:
            run = _run_worker(target, options, Path(scratch))
            report = _report_from_run(target, options, run)
    except Exception as exc:  # noqa: BLE001 - e.g. the child could not be started
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        report = SubmissionReport(
            target, options.style or "unknown", gradable=False,
            traceback=f"moco-ref internal error while running the submission:\n{trace}",
        )
    report.wall_seconds = time.monotonic() - started
    return report


def grade_many(
    targets: list[str], options: GradeOptions | None = None, *, jobs: int = 1, on_report=None
) -> list[SubmissionReport]:
    """Grade several submissions under the same options, ``jobs`` child processes at a
    time; reports keep the order of ``targets``. ``on_report(report)`` is called as each one
    finishes."""
    options = options or GradeOptions()
    return grade_tasks([(target, options) for target in targets], jobs=jobs, on_report=on_report)


def grade_tasks(
    tasks: list[tuple[str, GradeOptions]], *, jobs: int = 1, on_report=None
) -> list[SubmissionReport]:
    """Like ``grade_many`` with options of its own for each submission."""

    def grade(task: tuple[str, GradeOptions]) -> SubmissionReport:
        report = grade_submission(*task)
        if on_report is not None:
            on_report(report)
        return report

    if jobs <= 1 or len(tasks) <= 1:
        return [grade(task) for task in tasks]
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="moco-ref-grade") as pool:
        return list(pool.map(grade, tasks))


# --------------------------------------------------------------------------- the child


class _WorkerRun:
    def __init__(self) -> None:
        self.record: dict | None = None
        self.record_error = ""
        self.progress: dict | None = None
        self.timed_out = False
        self.returncode: int | None = None
        self.stdout = ""
        self.stderr = ""


def _run_worker(target: str, options: GradeOptions, scratch: Path) -> _WorkerRun:
    workdir = scratch / "work"
    workdir.mkdir()
    record_path = scratch / RECORD_FILE_NAME
    command = [
        sys.executable,
        "-m",
        "moco_ref.grading.worker",
        "--target",
        target if is_module_target(target) else str(Path(target).resolve()),
        "--output",
        str(record_path),
        "--options",
        json.dumps(options.to_dict()),
        "--import-root",
        os.getcwd(),
    ]
    run = _WorkerRun()
    process = subprocess.Popen(
        command,
        cwd=workdir,
        env=_child_environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, killed as one
        preexec_fn=_limits(options.memory_mb),
    )
    stdout, stderr = StreamDrain(process.stdout), StreamDrain(process.stderr)
    try:
        run.returncode = process.wait(timeout=options.timeout)
    except subprocess.TimeoutExpired:
        run.timed_out = True
    finally:
        _kill_group(process)
        run.returncode = process.wait()
    run.stdout, run.stderr = stdout.finish(), stderr.finish()
    for pipe in (process.stdout, process.stderr):
        pipe.close()
    if record_path.exists():
        try:
            run.record = torch.load(record_path, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - anything but plain data is refused
            run.record_error = f"the observations could not be read as plain data: {exc}"
    progress_path = scratch / PROGRESS_FILE_NAME
    if progress_path.exists():
        try:
            run.progress = json.loads(progress_path.read_text())
        except ValueError:
            run.progress = None
    return run


def _child_environment() -> dict:
    env = dict(os.environ)
    if not _installed_in_site_packages():  # a source checkout: the child must find moco_ref
        env["PYTHONPATH"] = os.pathsep.join(
            part for part in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if part
        )
    env.update(
        PYTHONUNBUFFERED="1",  # what was printed before a crash is not lost in a buffer
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        MPLBACKEND="Agg",  # plots in executed notebook cells draw nowhere
    )
    return env


def _installed_in_site_packages() -> bool:
    """Site-packages must not go on PYTHONPATH: it would come before the standard library."""
    paths = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    paths.update(getattr(site, "getsitepackages", list)())
    return any(Path(path).resolve() == Path(_PACKAGE_ROOT) for path in paths if path)


def _limits(memory_mb: int | None):
    limit = memory_mb * 2**20 if memory_mb and memory_mb > 0 else None

    def apply() -> None:  # runs in the child between fork and exec
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core dumps from crashes
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))

    return apply


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


# --------------------------------------------------------------------------- the verdict


def _report_from_run(target: str, options: GradeOptions, run: _WorkerRun) -> SubmissionReport:
    record = run.record
    style = (record or {}).get("style") or (run.progress or {}).get("style") or options.style
    notes = list((record or run.progress or {}).get("notes") or [])
    report = SubmissionReport(
        submission=target,
        style=style or "unknown",
        gradable=False,
        notes=notes,
        stdout=run.stdout,
        stderr=run.stderr,
    )
    if record is not None and record.get("gradable"):
        return _judged(report, record["observations"], options)
    if record is not None:
        report.traceback = record.get("traceback") or f"failed while: {record.get('stage')}"
        return report
    if run.timed_out and run.progress is not None:
        return _timed_out(report, options)
    report.traceback = _why_no_record(run, options)
    return report


def _judged(report: SubmissionReport, observations: dict, options: GradeOptions):
    try:
        from moco_ref.conformance.judge import judge

        with _JUDGE_LOCK:
            results, inferred = judge(observations, report.style, options)
    except Exception as exc:  # noqa: BLE001 - a grader bug must not end the whole run
        report.traceback = "moco-ref internal error while judging (please report it):\n" + (
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        )
        return report
    report.gradable = True
    report.results = list(results)
    report.inferred = dict(inferred)
    return report


def _timed_out(report: SubmissionReport, options: GradeOptions) -> SubmissionReport:
    """Loaded but not observed within the time: every selected check of its style times out."""
    try:
        from moco_ref.conformance.registry import all_checks

        specs = [spec for spec in all_checks(report.style) if options.selects(spec.check_id)]
    except Exception as exc:  # noqa: BLE001
        report.traceback = f"timed out after {options.timeout:g} s (checks unknown: {exc})"
        return report
    message = (
        f"the submission did not finish within {options.timeout:g} s of wall-clock time "
        "and was stopped; an endless loop, or far more work than the probe needs?"
    )
    report.gradable = True
    report.results = [
        CheckResult(spec.check_id, spec.title, spec.family, spec.points, Status.TIMEOUT, message)
        for spec in specs
    ]
    return report


def _why_no_record(run: _WorkerRun, options: GradeOptions) -> str:
    if run.record_error:
        return run.record_error
    if run.timed_out:
        return (
            f"timed out after {options.timeout:g} s while loading the submission (before any "
            "observation): top-level work such as a training run? Notebooks skip it unless "
            "--execute-all-cells is given."
        )
    code = run.returncode
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        cause = f"was killed by {name}"
        if -code == signal.SIGKILL:
            cause += f" (out of memory? the limit is {options.memory_mb} MB of address space)"
    else:
        cause = f"exited with code {code}"
    tail = run.stderr.strip()[-4000:]
    return f"the submission's process {cause} before any observation was recorded" + (
        f"\n--- end of its stderr ---\n{tail}" if tail else ""
    )
