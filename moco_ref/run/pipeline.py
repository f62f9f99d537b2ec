"""Grading one submission end to end: observe it in the sandbox, validate every part it
sent against the probe the grader asked for, judge the record here by recomputation, and
write the ``SubmissionReport``.

A part that was not observed (it ran out of time, its process died, or what it sent was
inconsistent) reaches the judge as a typed ``Unobserved`` entry, so every check that needs it
reports ``timeout`` or ``error`` with the reason — never ``passed`` — while the checks on the
other parts are judged as usual. Nothing a submission does raises out of
``grade_submission``; ``observe_sandboxed`` observes and validates the same way without
judging (for ``moco-ref record``).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

# Everything validating and judging needs is imported here, before any submission runs:
# nothing a submission does to files afterwards can change the grader's code.
from moco_ref.judge import checks as _checks  # noqa: F401
from moco_ref.judge.inspection import inspection_notes
from moco_ref.judge.judge import OUT_OF_TIME, judge
from moco_ref.judge.record import GraderOutOfTime
from moco_ref.judge.results import Status, SubmissionReport
from moco_ref.judge.styles import JUDGED_STYLES, validate_part
from moco_ref.judge.untrusted import clean_text
from moco_ref.probe import builder as _builder_probe  # noqa: F401
from moco_ref.probe import lab as _lab_probe  # noqa: F401
from moco_ref.probe import parts as parts_module
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import Unobserved
from moco_ref.probe.source import (
    bound_entry_points,
    is_module_target,
    loop_name_rebindings,
    moco_like_class,
    module_file,
    stated_capacity,
    styles_of,
    top_level_names,
)
from moco_ref.probe.styles import BUILDER_CLASS, builder_class_name, style_of_names
from moco_ref.sandbox.observation import SandboxRun, observe_in_sandbox

SUBMISSION_LABEL = "(reported by the submission's process)"  # its notes are its own words
# Validating and judging are quick; one at a time keeps hypothesis and torch's global RNG calm.
_JUDGE_LOCK = threading.Lock()
# The grader's own time to check and judge one submission. It runs only while the grader
# works on that submission (holding the judge lock): time spent waiting for a neighbour's
# judging is never charged, and running out is the grader's trouble, never a verdict.
GRADER_SECONDS = 60.0


class GraderClock:
    """The grader's own time for one submission, counted only while it works on it."""

    def __init__(self, seconds: float = GRADER_SECONDS) -> None:
        self.left = seconds

    @contextlib.contextmanager
    def working(self):
        """Hold the judge lock; yields the deadline of this stretch of work."""
        with _JUDGE_LOCK:
            started = time.monotonic()
            try:
                yield started + self.left
            finally:
                self.left -= time.monotonic() - started


def grade_submission(target: str, options: GradeOptions | None = None, *,
                     isolation: str | None = None, helpers: bool = True,
                     single_run: bool = False) -> SubmissionReport:
    """Observe ``target`` in a sandboxed process, judge the observations here, and report.
    ``isolation``: a rung of ``sandbox.client.ISOLATION_MODES`` (None: the environment's
    default, the ladder); ``helpers``:
    whether the ``.py`` files beside it may be its helper modules (not in a folder several
    students share); ``single_run``: this process grades no other submission (the
    autograder's ``gradescope run``), so the warm process is stopped as soon as the
    submission has been observed — its memory is freed before judging, not held beside it
    (issue 27: one run's peak is the larger of the two phases, not their sum)."""
    options = options or GradeOptions()
    started = time.monotonic()
    options, style_note = style_decided(target, options)
    options = with_stated_capacity(target, options)
    try:
        run = observe_in_sandbox(target, options, isolation, helpers=helpers)
        if single_run:
            _stop_warm_processes()
        report = _report(target, options, run)
        if style_note:
            report.notes.insert(0, style_note)
        report.staff_notes = inspection_notes(target)
    except Exception as exc:  # noqa: BLE001 - e.g. the zygote could not be started
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        report = SubmissionReport(
            target, options.style or "unknown", gradable=False,
            traceback=f"moco-ref internal error while running the submission:\n{trace}",
            grader_trouble=f"internal error: {type(exc).__name__}: {exc}"[:500],
        )
    report.wall_seconds = time.monotonic() - started
    return _cleaned(report)


def _stop_warm_processes() -> None:
    """Stop the warm processes (and their sandboxes): nothing else will be forked from them.
    A later grading in this process would start one anew."""
    from moco_ref.sandbox.client import shutdown_zygotes

    shutdown_zygotes()


def _source_file(target: str) -> Path | None:
    """The file whose source the grader reads for ``target`` (a path, or ``pkg.module``'s
    file); None when there is no such file."""
    path = module_file(target) if is_module_target(target) else Path(target)
    return path if path is not None and path.is_file() else None


def with_stated_capacity(target: str, options: GradeOptions) -> GradeOptions:
    """A lab submission's options with the capacity its source states, when it states one and
    the course pinned none (``--expect-capacity``): what a queue that never dropped an entry
    is held to."""
    if options.style != "lab" or options.expect_capacity is not None:
        return options
    path = _source_file(target)
    stated = stated_capacity(path) if path is not None else None
    if stated is None:
        return options
    return replace(options, stated_capacity=stated[0], stated_capacity_line=stated[1])


def style_decided(target: str, options: GradeOptions) -> tuple[GradeOptions, str]:
    """The style is the grader's decision, never what the submission's process reports:
    pinned (``--style``, the course's rubric) or read from the source — the entry points the
    file binds at top level (``probe.source``). Returns the options to observe with and,
    for a file that binds the entry points of more than one style, the note that says which
    one it is graded as. A source that binds none (e.g. a star import) leaves detection to
    the loaded namespace, under the same rule."""
    path = _source_file(target)
    names = bound_entry_points(path) if path is not None else set()
    present = styles_of(names)  # the file is read once
    chosen = options.style or style_of_names(names)
    like = moco_like_class(path) if path is not None and chosen in (None, "builder") \
        and not names else None
    if like is not None:  # a MoCo module under another name: the builder's class
        name, marks = like
        note = (f"it defines no class MoCo; class {name} is a MoCo module ({', '.join(marks)}): "
                f"graded as the MoCo module (name it MoCo to match the official interface)")
        return replace(options, style="builder", builder_class=name), note
    if chosen is None:
        return options, ""
    note = ""
    builder_class = builder_class_name(top_level_names(path)) if path is not None and \
        chosen == "builder" else None
    if builder_class and builder_class != BUILDER_CLASS:
        note = (f"its builder class is named {builder_class}, not {BUILDER_CLASS}: graded as "
                f"the {BUILDER_CLASS} module (rename it to {BUILDER_CLASS} to match the "
                "official interface)")
    if len(present) > 1:
        how = "the course's style" if options.style else "by the style rule (train_moco: lab)"
        note = (f"it defines the entry points of {len(present)} styles "
                f"({', '.join(present)}): graded as {chosen}, {how}")
    return replace(options, style=chosen), note


def _rewrite_texts(report: SubmissionReport, rewrite, note_rewrite=None) -> SubmissionReport:
    """``rewrite`` applied to every text of the report that may carry the submission's
    words: its output, traceback, notes (``note_rewrite`` when given) and check messages."""
    report.stdout, report.stderr = rewrite(report.stdout), rewrite(report.stderr)
    report.traceback = rewrite(report.traceback)
    report.notes = [(note_rewrite or rewrite)(note) for note in report.notes]
    report.results = [replace(result, message=rewrite(result.message))
                      for result in report.results]
    return report


def _shown_as_original(report: SubmissionReport, run: SandboxRun) -> SubmissionReport:
    """Paths of the copy the submission's process loaded, written as the original's."""
    pairs = run.copies

    def restore(text: str) -> str:
        for copy, original in pairs:
            text = text.replace(copy, original)
        return text

    return _rewrite_texts(report, restore)


def _cleaned(report: SubmissionReport) -> SubmissionReport:
    """The report made safe to show (``untrusted.clean_text``); at most 50 notes."""
    report.notes = report.notes[:50]
    return _rewrite_texts(report, clean_text, lambda note: clean_text(note, cap=2_000))


def grade_many(
    targets: list[str], options: GradeOptions | None = None, *, jobs: int = 1, on_report=None,
    isolation: str | None = None,
) -> list[SubmissionReport]:
    """Grade several submissions under the same options, ``jobs`` at a time; reports keep the
    order of ``targets``. ``on_report(report)`` is called as each one finishes."""
    options = options or GradeOptions()
    return grade_tasks([(target, options) for target in targets], jobs=jobs, on_report=on_report,
                       isolation=isolation)


def grade_tasks(
    tasks: list[tuple], *, jobs: int = 1, on_report=None, isolation: str | None = None,
) -> list[SubmissionReport]:
    """Like ``grade_many`` with options of its own for each submission: each task is
    ``(target, options)`` or ``(target, options, helpers)``.

    A report made under the grader's own trouble (``grader_trouble``: an internal error, the
    grader's time ran out) never stands: once every other submission is done, that one is
    graded again alone; if the trouble persists, its report says so (for staff), and it is
    never cached. ``on_report`` sees each submission's final report only."""

    def grade(task: tuple) -> SubmissionReport:
        target, options, *rest = task
        return grade_submission(target, options, isolation=isolation,
                                helpers=bool(rest[0]) if rest else True)

    def graded(task: tuple) -> SubmissionReport:
        report = grade(task)
        if on_report is not None and not report.grader_trouble:
            on_report(report)
        return report

    if jobs <= 1 or len(tasks) <= 1:
        reports = [graded(task) for task in tasks]
    else:
        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="moco-ref-grade")
        try:
            reports = list(pool.map(graded, tasks))
        except KeyboardInterrupt:  # Ctrl-C: nothing new starts; the jobs running finish
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True)
    for index, (task, report) in enumerate(zip(tasks, reports)):
        if report.grader_trouble:
            again = grade(task)  # alone: nothing else runs beside it now
            if again.grader_trouble:
                again.notes.append(f"graded twice, the second time alone; both times the "
                                   f"grader had trouble ({again.grader_trouble}): this is "
                                   "not the submission's grade, report it to the course staff")
            reports[index] = again
            if on_report is not None:
                on_report(again)
    return reports


def _report(target: str, options: GradeOptions, run: SandboxRun) -> SubmissionReport:
    report = _report_shell(target, options, run)
    if not report.traceback:
        report = _judged(report, options, run, GraderClock())
    return _shown_as_original(report, run)


def _report_shell(target: str, options: GradeOptions, run: SandboxRun) -> SubmissionReport:
    """The report before judging: style, notes, output; ``traceback`` set when the submission
    is not gradable."""
    style = run.reported_style or options.style or "unknown"
    notes = [f"{SUBMISSION_LABEL} {note}" for note in run.notes]
    # issue 26: helper modules not copied for shadowing an installed module (sandbox.attempt)
    notes += run.attempts[0].refused_helpers if run.attempts else []
    refused = run.refused_imports
    if refused:
        notes.append("the submission tried to import the reference implementation ("
                     + ", ".join(refused) + "); the import was refused")
    report = SubmissionReport(
        submission=target,
        style=style,
        gradable=False,
        notes=notes,
        stdout=run.stdout,
        stderr=run.stderr,
        isolation=run.isolation,
        grader_trouble=run.grader_trouble,  # e.g. a job starved of CPU until its time ran out
    )
    if run.failure:
        report.traceback = run.failure
        return report
    if options.style is not None and style != options.style:
        report.traceback = (f"the submission's process reported style {style!r} where "
                            f"{options.style!r} was asked for: the record was tampered with")
        return report
    if not run.done and not any(gap.timed_out for gap in run.missing.values()):
        # crashed before any observation: not gradable, as at load time
        report.traceback = "\n".join(f"{name}: {gap.reason}"
                                     for name, gap in run.missing.items())
    return report


# --------------------------------------------------------------------------- the verdict


def _assembled(report: SubmissionReport, options: GradeOptions, run: SandboxRun,
               clock: GraderClock | None = None) -> tuple[dict, dict[str, Unobserved]]:
    """The observation record to judge: the validated parts, and an ``Unobserved`` entry for
    each part that is missing, failed or invalid. Returns ``(observations, missing)``."""
    style = report.style
    missing = dict(run.missing)
    entries: dict[str, object] = {}
    meta: list[dict] = []
    for name, part in run.done.items():
        if part.failed is not None:
            missing[name] = Unobserved(name, "observing it raised:\n" + part.failed, False)
            continue
        try:
            with (clock or GraderClock()).working() as deadline:  # one at a time: the probe
                problem = validate_part(style, name, part.data, part.meta, options,  # uses
                                        deadline=deadline)  # torch's global RNG
        except GraderOutOfTime:
            missing[name] = Unobserved(name, "the grader's own time ran out while it checked "
                                       "these observations (the grader's trouble: it is "
                                       "graded again)", True)
            report.grader_trouble = "the grader's time for checking the observations ran out"
            continue
        if problem:
            missing[name] = Unobserved(
                name, "its observations are inconsistent with the probe the grader ran, so "
                f"they were discarded: {problem}", False)
            continue
        entries[name] = part.data
        meta.append(part.meta or {})
        if isinstance(part.data, dict) and part.data.get(parts_module.INPUT_MUTATED):
            report.notes.append(
                "train_moco modified its input x (the probe's images) in place; its recorded "
                "forwards could not be cross-checked against the probe's own images")
    entries.update(missing)
    observations = parts_module.assemble(style, meta, entries)
    known = JUDGED_STYLES.get(style)
    if known is not None:
        known.complete(observations, run.stage.defined if run.stage else {}, options)
    observations.setdefault("style", style)
    return observations, missing


def _judged(report: SubmissionReport, options: GradeOptions, run: SandboxRun,
            clock: GraderClock) -> SubmissionReport:
    observations, _ = _assembled(report, options, run, clock)
    try:
        with clock.working() as deadline:
            results, inferred = judge(observations, report.style, options, deadline=deadline)
    except Exception as exc:  # noqa: BLE001 - a grader bug must not end the whole run
        report.traceback = "moco-ref internal error while judging (please report it):\n" + (
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        )
        report.grader_trouble = f"internal error while judging: {type(exc).__name__}"
        return report
    report.gradable = True
    if any(result.message == OUT_OF_TIME for result in results):
        report.grader_trouble = "the grader's time for judging ran out"
    skipped = run.stage.skipped if run.stage else {}
    report.results = [_with_rebinding_line(_with_skipped_line(result, skipped),
                                           report.submission) for result in results]
    report.inferred = dict(inferred)
    return report


def _with_rebinding_line(result, submission: str):
    """An EMA that never moved the key encoder names the source line that rebinds the
    loop's name instead of writing the parameter, when the file has one."""
    if result.check_id != "I7-ema-law" or result.status is not Status.FAILED or \
            "never moved" not in (result.message or ""):
        return result
    path = _source_file(submission)
    lines = loop_name_rebindings(path) if path is not None else []
    if not lines:
        return result
    number, text = lines[0]
    hint = (f"\nline {number}: `{text}` binds a new tensor to the loop's name; the parameter "
            "it named is never written. Update it in place, e.g. "
            "p_k.data.mul_(m).add_(p_q.data, alpha=1 - m), or p_k.lerp_(p_q, 1 - m).")
    return replace(result, message=result.message + hint)


_NAME_ERROR = re.compile(r"NameError: name '([A-Za-z_][A-Za-z0-9_]{0,80})' is not defined")


def _with_skipped_line(result, skipped):
    """A NameError for a name that a skipped top-level statement of the notebook would have
    bound says so: the statement, and how to have it run."""
    match = _NAME_ERROR.search(result.message or "")
    if not match or not isinstance(skipped, dict):
        return result
    where = skipped.get(match.group(1))
    if not isinstance(where, str):
        return result
    hint = (f"\n{match.group(1)} is assigned in {where[:200]}, which the grader skipped as "
            "top-level work (only imports, definitions and constant assignments run). Make it "
            "a constant, compute it inside the function that uses it, or grade with "
            "--execute-all-cells.")
    return replace(result, message=result.message + hint)


def observe_sandboxed(target: str, options: GradeOptions | None = None, *,
                      isolation: str | None = None) -> dict:
    """Observe ``target`` in the sandbox, exactly as grading does, without judging:
    ``{"gradable", "style", "notes", "traceback", "observations", "missing"}``. The
    observations are validated part by part; a missing or invalid part is left out and named
    with its reason in ``missing``."""
    options = options or GradeOptions()
    try:
        run = observe_in_sandbox(target, options, isolation)
    except Exception as exc:  # noqa: BLE001
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return {"gradable": False, "style": options.style, "notes": [], "observations": {},
                "missing": {}, "traceback": f"moco-ref internal error:\n{trace}"}
    report = _cleaned(_shown_as_original(_report_shell(target, options, run), run))
    record = {"gradable": False, "style": report.style, "notes": report.notes,
              "observations": {}, "missing": {}, "traceback": report.traceback}
    if report.traceback:
        return record
    observations, missing = _assembled(report, options, run)
    observations = {key: value for key, value in observations.items()
                    if not isinstance(value, Unobserved)}
    record.update(gradable=True, observations=observations, notes=report.notes,
                  missing={name: gap.reason for name, gap in missing.items()})
    return record
