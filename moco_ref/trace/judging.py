"""The grader's verdicts on a recording: the builder checks, per dictionary track, merged into
one verdict per check, read against what the user declared.

Declarations (what a library states about itself):
- ``ragged``: its policy when K is not a multiple of the batch. ``"drops"``: the keys of a
  batch that do not fit before the wrap are dropped (lightly's bank), so an I3 failure that is
  exactly that drop is the declared behaviour, named as such; ``"refuses"``: such a K must
  raise, so a recorded run with one fails. ``None``: the FIFO law holds as for any code.
- ``expect_fail``: ``{check id: reason}`` checks known to fail (pytest's xfail, strict: a
  check that then passes fails, so a fixed bug is noticed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from moco_ref.judge.judge import judge_evidence
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.trace_evidence import TraceEvidence
from moco_ref.probe.options import GradeOptions
from moco_ref.trace.tracks import track_records

if TYPE_CHECKING:  # Recording.judge calls this module: the type is for reading only
    from moco_ref.trace.recorder import Recording

RAGGED_POLICIES = (None, "drops", "refuses")
FIFO = "I3-fifo-keeps-newest"
TEMPERATURE = "I8-temperature-divides-logits"
_RANK = {Status.FAILED: 0, Status.ERROR: 1, Status.TIMEOUT: 1, Status.NOT_JUDGED: 2,
         Status.PASSED: 3, Status.NOT_APPLICABLE: 4}


@dataclass
class TraceReport:
    """The verdicts on one recording, as a grading report (``report``) with the shortcuts a
    test reads."""

    report: SubmissionReport

    @property
    def results(self) -> list[CheckResult]:
        return self.report.results

    @property
    def score(self) -> float:
        return self.report.score

    @property
    def max_score(self) -> float:
        return self.report.max_score

    @property
    def failed(self) -> list[str]:
        return [r.check_id for r in self.results if r.status in (Status.FAILED, Status.ERROR,
                                                                   Status.TIMEOUT)]

    @property
    def not_judged(self) -> list[str]:
        return [r.check_id for r in self.results if r.status is Status.NOT_JUDGED]

    def result(self, check_id: str) -> CheckResult:
        return next(r for r in self.results if r.check_id == check_id)

    def text(self) -> str:
        """The grader's table: every check, each not-passed one with its evidence."""
        from moco_ref.report.formats import render_text

        lines = render_text([self.report], width=100).splitlines()
        return "\n".join(line for line in lines  # a recording is rerun by its own test
                         if not line.lstrip().startswith(("rerun:", "moco-ref grade")))


def judge_recording(recording: Recording, *, ragged: str | None = None,
                    expect_fail: dict[str, str] | None = None,
                    checks: tuple[str, ...] = ()) -> TraceReport:
    """The builder checks on every track of ``recording``, one verdict per check."""
    if ragged not in RAGGED_POLICIES:
        raise ValueError(f"ragged must be one of {RAGGED_POLICIES}, not {ragged!r}")
    parts = recording.parts
    options = GradeOptions(style="builder", checks=tuple(checks),
                           temperature=parts.temperature or 0.2, expect_m=parts.momentum)
    tracks, inferred = [], {"style": "recording"}
    for name, record in track_records(recording):
        evidence = TraceEvidence(record, options, temperature=parts.temperature,
                                 momentum=parts.momentum, from_start=parts.from_start)
        results, found = judge_evidence(evidence, "builder", options)
        tracks.append((name, results, record, evidence))
        inferred.update({k: v for k, v in found.items() if k not in inferred})
    inferred["style"] = "recording (trusted code, in your process)"
    inferred["steps_recorded"] = len(recording.steps)
    if recording.ignored_forwards:
        inferred["forwards_outside_training"] = recording.ignored_forwards
    results = [_merged([(name, results[i]) for name, results, _, _ in tracks])
               for i in range(len(tracks[0][1]))]
    probe = tracks[0][2]["probe"]
    drops = ragged == "drops" and all(_drops(evidence) for *_, evidence in tracks)
    results = [_declared(r, parts, ragged, probe, expect_fail or {}, drops) for r in results]
    if not recording.steps:
        results = [r if r.status is Status.NOT_APPLICABLE else replace(
            r, status=Status.ERROR, message=NO_STEPS) for r in results]
    report = SubmissionReport(recording.name, "builder", True, results, inferred)
    return TraceReport(report)


NO_STEPS = ("no training step was recorded: inside the record_moco block no optimizer.step() "
            "followed a forward of the query encoder in training mode")


def _merged(verdicts: list[tuple[str, CheckResult]]) -> CheckResult:
    """One verdict from every track's: the worst, named by its track when there are several."""
    name, worst = min(verdicts, key=lambda pair: _RANK[pair[1].status])
    if len(verdicts) > 1 and name and worst.status not in (Status.PASSED,
                                                          Status.NOT_APPLICABLE):
        return replace(worst, message=f"in {name}: {worst.message}",
                       details={**worst.details, "track": name})
    return worst


def _drops(evidence: TraceEvidence) -> bool:
    """Whether the buffer is exactly a ring that drops what does not fit before the wrap."""
    try:
        return evidence.drop_policy_departure() is None
    except Exception:  # noqa: BLE001 - a buffer the checks cannot follow: they say why
        return False


def _declared(result: CheckResult, parts, ragged: str | None, probe: dict,
              expect_fail: dict[str, str], drops: bool) -> CheckResult:
    K, batch = int(probe.get("K") or 0), int(probe.get("batch") or 0)
    uneven = bool(K and batch and K % batch)
    if result.check_id == TEMPERATURE and parts.temperature is None and \
            result.status is not Status.NOT_APPLICABLE:
        result = replace(result, status=Status.NOT_JUDGED, message=(
            "not judged: the recording declares no temperature (pass MoCoParts(temperature=T) "
            "to hold the logits to it); the T that explains them is in the report"))
    if result.check_id == FIFO and uneven:
        if ragged == "drops" and result.status is Status.FAILED and drops:
            result = replace(result, status=Status.PASSED, message=(
                f"K = {K} is not a multiple of the batch {batch}: the keys that do not fit "
                f"before the wrap are dropped, as declared (ragged='drops'): "
                f"{result.details.get('where', '')}: {result.details.get('got', '')}"))
        elif ragged == "refuses":
            result = replace(result, status=Status.FAILED, message=(
                f"declared to refuse K not a multiple of the batch (ragged='refuses'), but it "
                f"trained with K = {K} and batch {batch} without raising"))
        elif result.status is Status.FAILED and ragged is None:
            result = replace(result, message=result.message + (
                f"\n(K = {K} is not a multiple of the batch {batch}: if dropping the keys "
                "that do not fit is the documented policy, declare ragged='drops')"))
    if result.check_id in expect_fail:
        reason = expect_fail[result.check_id]
        if result.status is Status.FAILED:
            result = replace(result, status=Status.NOT_APPLICABLE, message=(
                f"expected to fail ({reason}), and it does: {result.message}"))
        elif result.status is Status.PASSED:
            result = replace(result, status=Status.FAILED, message=(
                f"expected to fail ({reason}), but it passed: remove it from expect_fail"))
    return result
