"""Observing one submission in the sandbox, over as many fresh processes as it takes: a
part that ran out of time or whose process died is recorded missing, with why, and the
remaining parts are observed anew. Nothing here judges; ``moco_ref.run.pipeline`` does that with
what this returns (a ``SandboxRun``).


Each submission runs in a process of its own, forked from a warm ``zygote`` (torch and the
observer already imported), under a supervisor that kills everything it started when it
ends. By default (``bwrap``) the zygote lives in a bubblewrap sandbox that holds only the
Python installation and the observing side of moco_ref (``bwrap``), each job has namespaces of
its own with a private scratch (``jobspace``), and its process is confined before the
submission loads (``confine``, ``seccomp``). It has

- a wall-clock timeout for the whole job (``GradeOptions.timeout``) and one per observed part
  (``check_timeout``); CPU time and memory bounded over all the job's processes (the
  supervisor's ``JobWatch``: twice ``timeout`` CPU seconds, ``memory_mb`` of proportional set
  size), and per process an address space 4096 MB above ``memory_mb``, 256 processes and
  threads, no core dumps, no file larger than 1 GiB;
- no standard input; stdout/stderr captured, keeping the first and last 10 kB of each;
- the reference-import guard (``guard``) unless ``allow_reference_import``.

Observations come back as frames on a pipe no file name leads to (``channel``), part by part
(``parts``). The grader validates them against the probe it asked for (``record``) and judges
them by recomputation (``moco_ref.run.pipeline``). A part that ran out of time is reported
``timeout``; one whose process died, or whose observations were inconsistent, makes the
checks that need it report ``error``; the other parts are observed in a fresh process and
judged as usual. A job whose time ran out while other processes kept it from a CPU (less
than a third of its wall time on one, most of the rest waiting to run: ``attempt.starvation``,
from the supervisor's figures) is the grader's trouble (``SandboxRun.grader_trouble``): its
report is graded again alone and never cached; a job that slept until its time ran out is
the submission's timeout. A submission that cannot be loaded gives a report with
``gradable=False`` and the traceback; nothing a submission does raises out of
``grade_submission``.

With ``--isolation processes`` (trusted code only) there is no sandbox: the submission runs as
the grader's user with the grader's file system and network, and a process that kills the
supervisor and the zygote, leaves its session and clears its environment can outlive the job
(``procs`` sweeps catch the rest). The limits above still hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import ObservedPart, Stage, Unobserved, part_names
from moco_ref.probe.styles import OBSERVED_STYLES
from moco_ref.sandbox.attempt import Attempt, run_attempt
from moco_ref.sandbox.client import current_zygote

MIN_RETRY_SECONDS = 3.0  # observing the remaining parts anew needs at least this much time
LOAD_TIMED_OUT = "timed out after"  # how a report whose loading ran out of time begins


@dataclass
class SandboxRun:
    """Everything observing one submission gave, over one or more processes, typed: what the
    grader saw for itself (output, how each process ended, the parts it has and has not) and,
    apart, what the submission's process said (``stage``, ``reported_style``, ``notes``)."""

    attempts: list[Attempt]
    stage: Stage | None  # what the process said once the submission was loaded
    done: dict[str, ObservedPart]  # the parts observed, by part (not yet validated)
    missing: dict[str, Unobserved]  # parts not observed, and why
    failure: str  # why the submission is not gradable ("" when it is)
    isolation: str = ""  # from the zygote's hello, sent before any submission ran
    deadline: float = 0.0  # time.monotonic() when the submission's --timeout ends
    grader_trouble: str = ""  # the grader's own failure (never the submission's), if any

    @property
    def stdout(self) -> str:
        return joined_output(self.attempts, "stdout")

    @property
    def stderr(self) -> str:
        return joined_output(self.attempts, "stderr")

    @property
    def reported_style(self) -> str | None:
        """The style the submission's process named (its words)."""
        if self.stage is not None:
            return self.stage.style
        result = self._result()
        return str(result["style"])[:80] if isinstance(result.get("style"), str) else None

    @property
    def notes(self) -> list[str]:
        """The submission's process's own notes (e.g. what its loader skipped)."""
        if self.stage is not None:
            return list(self.stage.notes)
        notes = self._result().get("notes")
        return [note for note in notes[:200] if isinstance(note, str)] \
            if isinstance(notes, list) else []

    @property
    def refused_imports(self) -> list[str]:
        return sorted({str(name) for a in self.attempts
                       for name in ((a.result or {}).get("refused_imports") or [])})

    @property
    def copies(self) -> set[tuple[str, str]]:
        """(folder its process loaded the copy from, the submission's own folder)."""
        return {(a.copy_folder, a.original_folder) for a in self.attempts if a.copy_folder}

    def _result(self) -> dict:
        return next((a.result for a in self.attempts if isinstance(a.result, dict)), None) or {}


def observe_in_sandbox(target: str, options: GradeOptions, isolation: str | None = None,
                       *, helpers: bool = True) -> SandboxRun:
    zygote = current_zygote(reference=options.allow_reference_import, isolation=isolation)
    deadline = time.monotonic() + options.timeout  # the zygote's start-up is not the job's
    attempts: list[Attempt] = []
    stage: Stage | None = None
    done: dict[str, ObservedPart] = {}
    missing: dict[str, Unobserved] = {}
    trouble = ""
    only: list[str] | None = None
    failure = ""  # why the submission is not gradable, if it is not
    while True:
        attempt = run_attempt(zygote, target, options, deadline, only, helpers=helpers)
        attempts.append(attempt)
        if attempt.internal_error:
            failure = f"moco-ref internal error: {attempt.internal_error}"
            trouble = attempt.internal_error
            break
        trouble = trouble or attempt.starved()  # its time ran out for want of a CPU
        if attempt.stage is None or (stage is not None and attempt.stage != stage):
            if stage is None:
                failure = _not_loaded(attempt, options)
                break
            for name in _remaining(stage, done, missing):
                missing[name] = Unobserved(
                    name, "the submission loaded differently in a fresh process and could not "
                    "be observed again", False)
            break
        stage = attempt.stage
        if stage.style not in OBSERVED_STYLES:
            failure = ("the submission's process reported a style the grader does not know "
                       f"({stage.style!r}): the record was tampered with")
            break
        progress = False
        for name, payload in attempt.parts.items():
            if name in planned_parts(stage) and name not in done and name not in missing:
                done[name] = payload
                progress = True
        if attempt.corrupt:
            for name in _remaining(stage, done, missing):
                missing[name] = Unobserved(
                    name, f"the observation channel was tampered with ({attempt.corrupt})", False)
            break
        running = attempt.started_part
        if running is not None and running not in done and running not in missing:
            missing[running] = Unobserved(running, *_why_unfinished(attempt, options))
            progress = True
        remaining = _remaining(stage, done, missing)
        if not remaining or attempt.result is not None:
            for name in remaining:  # finished, yet not observed: not the worker's doing
                missing[name] = Unobserved(name, "no observation was sent for it", False)
            break
        if attempt.timed_out or deadline - time.monotonic() < MIN_RETRY_SECONDS:
            why = f"the submission's {options.timeout:g} s ran out"
            if trouble:
                why = f"{why}, but {_grader_s(trouble)}"
            for name in remaining:
                missing[name] = Unobserved(name, f"not observed: {why}", True)
            break
        if not progress:
            for name in remaining:
                missing[name] = Unobserved(
                    name, f"{attempt.exit_text()} before observing it", False)
            break
        only = remaining  # the rest, in a fresh process
    return SandboxRun(attempts, stage, done, missing, failure, isolation=zygote.namespaces,
                      deadline=deadline, grader_trouble=trouble)


def planned_parts(stage: Stage) -> list[str]:
    """The parts the grader observes for the style: its own list, never the one the
    submission's process sent."""
    return part_names(stage.style)


def _remaining(stage: Stage, done: dict, missing: dict) -> list[str]:
    return [name for name in planned_parts(stage) if name not in done and name not in missing]


def _grader_s(starved: str) -> str:
    return f"{starved} (the grader's trouble, not the submission's: it is graded again alone)"


def _why_unfinished(attempt: Attempt, options: GradeOptions) -> tuple[str, bool]:
    starved = attempt.starved()
    if starved:
        limit = (f"its {options.check_timeout:g} s (--check-timeout)" if attempt.part_timed_out
                 else f"{options.timeout:g} s of wall-clock time")
        return f"it did not finish within {limit}, but {_grader_s(starved)}", True
    if attempt.part_timed_out:
        return (f"it did not finish within its {options.check_timeout:g} s "
                "(--check-timeout): an endless loop, or far more work than the probe needs?",
                True)
    if attempt.timed_out:
        return (f"the submission did not finish within {options.timeout:g} s of wall-clock "
                "time and was stopped: an endless loop, or far more work than the probe needs?",
                True)
    text = attempt.exit_text() + " while it was being observed"
    if attempt.killed_by_sigkill():
        text += f" (out of memory? the job may use {options.memory_mb} MB)"
    tail = attempt.stderr.strip()[-2000:]
    if tail:
        text += f"\n--- end of its stderr ---\n{tail}"
    return text, False


def _not_loaded(attempt: Attempt, options: GradeOptions) -> str:
    """Why a submission that never reached observation is not gradable."""
    if attempt.result is not None and not attempt.result.get("gradable"):
        trace = attempt.result.get("traceback")
        return str(trace or f"failed while: {attempt.result.get('stage')}")
    if attempt.corrupt:
        return f"the observation channel was tampered with: {attempt.corrupt}"
    if attempt.timed_out and attempt.starved():
        return (f"{LOAD_TIMED_OUT} {options.timeout:g} s while loading the submission (before "
                f"any observation), but {_grader_s(attempt.starved())}")
    if attempt.timed_out:
        return (
            f"{LOAD_TIMED_OUT} {options.timeout:g} s while loading the submission (before any "
            "observation): top-level work such as a training run? Notebooks skip it unless "
            "--execute-all-cells is given."
        )
    cause = attempt.exit_text()
    if attempt.killed_by_sigkill():
        cause += f" (out of memory? the job may use {options.memory_mb} MB)"
    tail = attempt.stderr.strip()[-4000:]
    return f"{cause} before any observation was recorded" + (
        f"\n--- end of its stderr ---\n{tail}" if tail else ""
    )


def joined_output(attempts: list[Attempt], stream: str) -> str:
    if len(attempts) == 1:
        return getattr(attempts[0], stream)
    pieces = []
    for number, attempt in enumerate(attempts, start=1):
        label = "all parts" if attempt.asked is None else "parts " + ", ".join(attempt.asked)
        pieces.append(f"--- process {number} ({label}) ---\n{getattr(attempt, stream)}")
    return "\n".join(pieces)

