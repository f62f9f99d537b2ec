"""The judging side: runs in the grader's process on an observation record.

``judge(observations, style, options)`` builds the evidence for the style, runs every
selected check that applies to it, and reports the others as not applicable. A check that
raises something unexpected is an error of that check alone, with the grader's own
traceback, never a crash of the grading run.
"""

from __future__ import annotations

import re
import time
import traceback
from dataclasses import replace

from moco_ref.judge.assertions import (
    CheckFailure,
    NotExercised,
    NotJudged,
    NotRequired,
    SubmissionCrashed,
    SubmissionError,
)
from moco_ref.judge.gaps import PartNotObserved
from moco_ref.judge.lab_record import short_run_observations
from moco_ref.judge.registry import CheckSpec, all_checks, not_applicable_reason
from moco_ref.judge.results import CheckResult, Status
from moco_ref.judge.rubric import Rubric, charge_disabled
from moco_ref.judge.styles import JUDGED_STYLES
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.threads import one_thread

OUT_OF_TIME = ("not judged: the grader's own time for judging this submission ran out before "
               "this check (the grader's trouble, not the submission's: it is graded again)")


def judge(
    observations: dict, style: str, options: GradeOptions, *, deadline: float | None = None
) -> tuple[list[CheckResult], dict]:
    """Every selected check's verdict on ``observations``, and the values inferred from them
    (m, capacity, batch size, order, …). Past ``deadline`` (``time.monotonic()``), the
    checks not yet judged are errors that say so: judging a record cannot outlast the
    submission's time by more than one check."""
    with one_thread():
        return _judge(observations, style, options, deadline)


def judge_evidence(evidence, style: str, options: GradeOptions) -> tuple[list[CheckResult], dict]:
    """Every selected check's verdict on evidence built by the caller (a recording of trusted
    code: ``moco_ref.trace``). A check the evidence names in its ``not_applicable`` map (what
    such a recording cannot show: the two-process run, the constructor's ``mlp`` option) is
    not applicable, with the reason given, and its points go to the others by the rubric's
    rule."""
    with one_thread():
        return _judge({}, style, options, None, evidence)


def _judge(observations: dict, style: str, options: GradeOptions, deadline: float | None,
           evidence=None):
    broken = ""
    not_applicable = getattr(evidence, "not_applicable", {})
    if evidence is None and style in JUDGED_STYLES:
        try:
            evidence = JUDGED_STYLES[style].evidence(observations, options)
        except Exception as exc:  # noqa: BLE001 - a malformed record: every check not judged
            broken = not_followed(exc, "the observation record")
    results, crashes = [], {}
    for spec in all_checks():
        if not options.selects(spec.check_id):
            continue
        if not spec.applies_to(style) or spec.check_id in not_applicable:
            results.append(_result(spec, Status.NOT_APPLICABLE, not_applicable.get(
                spec.check_id) or not_applicable_reason(spec, style)))
        elif evidence is None:
            results.append(_result(spec, Status.NOT_JUDGED, broken) if broken else
                           _result(spec, Status.ERROR, f"style {style!r} is not judged"))
        elif deadline is not None and time.monotonic() > deadline:
            results.append(_result(spec, Status.ERROR, OUT_OF_TIME))
        else:
            results.append(_timed(run_check, spec, style, evidence, crashes))
    if evidence is not None and style == "lab" and observations:
        results = _with_short_run(results, observations, style, options, deadline)
    results = _with_points(results, style, options)
    inferred = {"style": style}
    if evidence is not None and (deadline is None or time.monotonic() <= deadline):
        inferred.update(evidence.inferred())
    return results, inferred


SHORT_RUN = ("in the second, short run ({n_train} training images, {epochs} epochs: a query meets "
             "its own image's key while the queue still has empty slots, and a 240-key queue is "
             "not yet full when train_moco returns) — ")


# what the short run is for: the dictionary (its entries, FIFO, mask) and the loss that reads it;
# the other families are judged on the main run alone (two steps cannot pin an EMA law)
SHORT_RUN_FAMILIES = ("I2", "I3", "I4", "I8", "I9")


def _with_short_run(results: list[CheckResult], observations: dict, style: str,
                    options: GradeOptions, deadline: float | None) -> list[CheckResult]:
    """A lab check of ``SHORT_RUN_FAMILIES`` that passed on the main run is judged again on
    the short run (``lab_record.short_run_observations``) and fails if it fails there: one
    verdict per check. Only a run the main probe found entirely right is judged again (a bug
    the main run saw is charged there, once), and only a failure is taken from the short run:
    what it could not judge leaves the main verdict."""
    if any(r.status not in (Status.PASSED, Status.NOT_APPLICABLE) for r in results):
        return results  # a bug the main run saw is charged there, not again in another light
    short = short_run_observations(observations)
    if short is None:
        return results
    try:
        evidence = JUDGED_STYLES[style].evidence(short, options)
    except Exception:  # noqa: BLE001 - an unreadable short run adds nothing
        return results
    probe = evidence.probe
    specs = {spec.check_id: spec for spec in all_checks(style)
             if spec.family in SHORT_RUN_FAMILIES}
    merged = []
    for result in results:
        spec = specs.get(result.check_id)
        if (result.status is Status.PASSED and spec is not None
                and (deadline is None or time.monotonic() <= deadline)):
            again = _timed(run_check, spec, style, evidence)
            seconds = result.seconds + again.seconds
            if again.status is Status.FAILED:
                message = SHORT_RUN.format(n_train=probe.n_train, epochs=probe.epochs)
                result = replace(again, message=message + again.message,
                                 details={**again.details, "run": "short"})
            result = replace(result, seconds=round(seconds, 6))
        merged.append(result)
    return merged


def _timed(run, spec: CheckSpec, *args) -> CheckResult:
    """``run(spec, *args)``, with the seconds it took in the result."""
    start = time.perf_counter()
    result = run(spec, *args)
    return replace(result, seconds=round(time.perf_counter() - start, 6))


def _with_points(results: list[CheckResult], style: str,
                 options: GradeOptions) -> list[CheckResult]:
    """Each result's points from the rubric, the shares of the checks that did not apply to
    this submission moved to the ones that did (``Rubric.points``: one rule, stated once)."""
    if style not in JUDGED_STYLES:
        return [replace(result, max_points=0.0) for result in results]
    skipped = {r.check_id for r in results if r.status is Status.NOT_APPLICABLE}
    points = Rubric.from_pairs(options.rubric).points(style, skipped)
    results = [replace(result, max_points=points.get(result.check_id, 0.0)) for result in results]
    return charge_disabled(results)  # points follow the harm (rubric's docstring)


def run_check(spec: CheckSpec, style: str, evidence: object,
              crashes: dict[str, str] | None = None) -> CheckResult:
    """One check on one submission's evidence. ``crashes`` maps each part already told to
    have crashed to the check that told it: a crash is told once, in full."""
    crashes = {} if crashes is None else crashes
    try:
        note = spec.implementations[style](evidence)
    except CheckFailure as failure:
        if failure.details.get("tells_crash"):  # this failure is why that part crashed
            crashes.setdefault(failure.details["tells_crash"], spec.check_id)
        details = {
            "misconception": failure.misconception,
            "where": failure.where,
            "expected": str(failure.expected),
            "got": str(failure.got),
            **failure.details,
        }
        return _result(spec, Status.FAILED, failure.message, details)
    except NotRequired as reason:
        return _result(spec, Status.NOT_APPLICABLE, str(reason))
    except NotJudged as reason:
        return _result(spec, Status.NOT_JUDGED, str(reason), {"needs": reason.needs})
    except NotExercised as reason:
        return _result(spec, Status.NOT_JUDGED, str(reason))
    except SubmissionCrashed as crash:
        if crash.part in crashes:
            return _result(spec, Status.NOT_JUDGED,
                           f"not run: {crash.summary} (told in full under {crashes[crash.part]})",
                           {"needs": crashes[crash.part]})
        crashes[crash.part] = spec.check_id
        return _result(spec, Status.ERROR, str(crash))
    except PartNotObserved as gap:
        return _result(spec, Status.TIMEOUT if gap.gap.timed_out else Status.ERROR, str(gap))
    except SubmissionError as error:
        return _result(spec, Status.ERROR, str(error))
    except Exception as exc:  # noqa: BLE001 - a grader bug must not take the other checks down
        try:  # a run that turned NaN is the loss check's to tell
            getattr(evidence, "require_finite", lambda what: None)("this check")
        except NotJudged as reason:
            return _result(spec, Status.NOT_JUDGED, str(reason),
                           {"needs": reason.needs, "grader_exception": _where_raised(exc)})
        return _result(spec, Status.NOT_JUDGED, not_followed(exc, "train_moco's run"),
                       {"grader_exception": _where_raised(exc)})
    return _result(spec, Status.PASSED, note or "", getattr(note, "details", None))


def not_followed(exc: BaseException, what: str) -> str:
    """What a check says when the grader's reading of the record met structure it does not
    model: the submission's terms only — no traceback, no grader path (the exception's type
    and the grader's own function, for whoever maintains the grader, in ``details``)."""
    return (f"not judged: the grader could not follow {what} here — it has a structure the "
            f"grader's reading of it does not model ({_plain_reason(exc)}); the other checks "
            "say what the submission did")


def _plain_reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:160]
    text = _PATH.sub("<grader>", text)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_PATH = re.compile(r"(?:/[^\s'\"]+)+")


def _where_raised(exc: BaseException) -> str:
    """``function (file.py:line)`` of the grader's frame that raised: names, not paths."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} in {last.name} ({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"


def _result(spec: CheckSpec, status: Status, message: str, details: dict | None = None):
    return CheckResult(spec.check_id, spec.title, spec.family, spec.points, status, message,
                       dict(details or {}))
