"""What a student sees, decided once: ``StudentView(report, rubric, platform)``.

Every surface a student reads (Gradescope's results, PrairieLearn's, the feedback pages, the
self-check) renders this view and never the raw report. It follows the rubric's one rule
(``Rubric.visibility_of``): each check is seen from a *time* on — at once (``visible``, or shown
later and released), after the due date, after the grades are published, or never (``hidden``).
A text seen at one time carries nothing of a check seen later:

- its loss story (``details["loss_story"]``) is told without the departures of a later check:
  those steps read as the reference loss, as in a submission without that fault;
- a check not judged because a later check failed names neither that check nor its reason;
- points a later check took over (``charge_disabled``) are shown where they were, and a later
  family's points are not added to an earlier check's;
- the loss series behind a figure go whenever a check that owns a loss choice is later
  (whatever the outcome, so that their absence says nothing);
- what still names a later check is cut down to the check's bare verdict;
- the inferred values of a later check's family are left out (``text.student_inferred``).

Totals, per platform (each platform's package declares its ``Showing``; ``PAGE`` is the
feedback pages' and the self-check's): Gradescope keeps every test in ``results.json`` with its
own visibility and releases each itself, and hides the total from students while a test is
not visible, so its ``score`` stays the true total (its gradebook needs it) while the summary
text states only the points of the visible tests. PrairieLearn shows what it receives at once:
only the checks shown now are sent and its score counts only them. The feedback pages and the
self-check state the total once every check is shown, else the points of the checks shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property

from moco_ref.judge.loss_story import (
    FACTOR_OWNERS,
    LOSS_CHECK_ID,
    VALUE_OWNERS,
    owners,
    story_text,
    story_verdict,
)
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC, Rubric
from moco_ref.report.text import student_inferred

NOW, NEVER = 0, 3
TIMES = {"visible": NOW, "after_due_date": 1, "after_published": 2, "hidden": NEVER}
# the checks whose conclusions a loss series (the figure of the loss per step) can show
LOSS_OWNERS = frozenset({LOSS_CHECK_ID, *FACTOR_OWNERS.values(), *VALUE_OWNERS.values()})
SERIES_KEYS = ("loss_reference", "loss_submission")
STORY_LIMITS = {"message": 4, "loss_by_step": 12}
NOT_YET = "not judged: it needs a check that is not shown yet"
BARE = {Status.PASSED: "", Status.FAILED: "failed (the evidence is shown with a check that is "
        "not shown yet)", Status.ERROR: "the check could not run",
        Status.TIMEOUT: "timed out", Status.NOT_JUDGED: "not judged"}


@dataclass(frozen=True)
class Showing:
    """How a surface shows checks to a student."""

    name: str
    # the surface receives every check with its visibility and shows each at its time
    releases_itself: bool
    # the surface hides the total from students while any check is withheld
    hides_total_while_withheld: bool


PAGE = Showing("page", releases_itself=False, hides_total_while_withheld=False)


class StudentView:
    """The report as one student sees it on ``platform`` now."""

    def __init__(self, report: SubmissionReport, rubric: Rubric | None = None,
                 platform: Showing = PAGE) -> None:
        self.report = report
        self.rubric = rubric or DEFAULT_RUBRIC
        self.platform = platform
        self.listed = [r for r in report.results if r.status is not Status.NOT_APPLICABLE]
        self._ids = {r.check_id for r in report.results}

    # ------------------------------------------------------------------ when each is seen

    def time_of(self, check_id: str) -> int:
        """When the student sees the check: 0 now, 1 after the due date, 2 once published,
        3 never."""
        visibility = self.rubric.visibility_of(check_id)
        if not self.platform.releases_itself and self.rubric.shown_now(check_id):
            return NOW
        return TIMES[visibility]

    def later_than(self, time: int) -> frozenset[str]:
        """The checks (of this report) the student sees only after ``time``."""
        return frozenset(c for c in self._ids if self.time_of(c) > time)

    @cached_property
    def withheld_now(self) -> frozenset[str]:
        return self.later_than(NOW)

    # ------------------------------------------------------------------ what is listed

    @cached_property
    def shown(self) -> list[CheckResult]:
        """The checks shown now, each as the student may read it."""
        return [self.seen(r) for r in self.listed if self.time_of(r.check_id) == NOW]

    @cached_property
    def later(self) -> list[CheckResult]:
        """The checks shown later (named by title only, the same for every student)."""
        return [r for r in self.listed if NOW < self.time_of(r.check_id) < NEVER]

    @cached_property
    def hidden(self) -> list[CheckResult]:
        return [r for r in self.listed if self.time_of(r.check_id) == NEVER]

    @cached_property
    def not_applicable(self) -> list[str]:
        return [r.check_id for r in self.report.results if r.status is Status.NOT_APPLICABLE
                and self.time_of(r.check_id) == NOW]

    @cached_property
    def withheld_families(self) -> set[str]:
        return {r.family for r in self.listed if r.check_id in self.withheld_now}

    @cached_property
    def inferred(self) -> dict:
        return student_inferred(self.report.inferred, self.withheld_families)

    # ------------------------------------------------------------------ points

    @property
    def complete(self) -> bool:
        """Every check that applies is shown now: the total may be stated."""
        return not any(r.check_id in self.withheld_now for r in self.listed)

    @cached_property
    def shown_score(self) -> float:
        return round(sum(r.points for r in self.shown), 2)

    @cached_property
    def shown_max_score(self) -> float:
        return round(sum(r.max_points for r in self.shown), 2)

    # ------------------------------------------------------------------ one check's text

    def seen(self, result: CheckResult) -> CheckResult:
        """``result`` as read at the time it is shown: nothing of a check shown later."""
        return student_result(result, self.later_than(self.time_of(result.check_id)))


def student_result(result: CheckResult, later: frozenset[str]) -> CheckResult:
    """``result`` without the conclusions of the ``later`` checks (the module's rules)."""
    if not later:
        return result
    details = dict(result.details)
    message = result.message
    if details.get("needs") in later:
        return replace(result, message=NOT_YET, details={})
    story = details.get("loss_story")
    if isinstance(story, dict):
        message, details = _retold(message, details, story, later)
    if later & LOSS_OWNERS:
        for key in SERIES_KEYS:
            details.pop(key, None)
    max_points = result.max_points
    if details.get("charged_to") in later:
        max_points = float(details.pop("points_before_charge", max_points))
        details.pop("charged_to")
    note = details.get("charge_note")
    if note and _disables_later(details, later):
        message = message.removesuffix(note)
        max_points = round(max_points - float(details.get("charged_points", 0.0)), 2)
        for key in ("charge_note", "charged_points", "disables"):
            details.pop(key, None)
    if _names_any(message, details, later):
        message, details = BARE.get(result.status, ""), {}
    return replace(result, message=message, details=details, max_points=max_points)


def _retold(message: str, details: dict, story: dict, later) -> tuple[str, dict]:
    if not owners(story) & later:
        return message, details
    if details.get("loss_story_is_message"):
        message = story_verdict(story, later)
    else:
        message = message.replace(story_text(story, STORY_LIMITS["message"]),
                                  story_text(story, STORY_LIMITS["message"], later))
    for key in ("got", "loss_by_step"):
        if isinstance(details.get(key), str):
            limit = STORY_LIMITS["loss_by_step" if key == "loss_by_step" else "message"]
            details[key] = details[key].replace(story_text(story, limit),
                                                story_text(story, limit, later))
    details["loss_story"] = {"runs": [
        {**run, "parts": [part for part in run.get("parts", []) if part[0] not in later]}
        for run in story.get("runs", [])]}
    return message, details


def _disables_later(details: dict, later) -> bool:
    families = set(details.get("disables") or [])
    return any(check.split("-", 1)[0] in families for check in later)


def _names_any(message: str, details: dict, later) -> bool:
    text = message + " " + repr(details)
    return any(re.search(rf"(?<![\w-]){re.escape(check)}(?![\w-])", text) for check in later)
