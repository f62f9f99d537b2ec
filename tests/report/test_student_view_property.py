"""The student view's one property: for every check and every visibility that withholds it,
a report whose only failure is that check, rendered for every student platform, holds none of
that check's evidence, its misconception or its points, on any surface seen before it is.

The report carries the check's conclusion everywhere a grader's report can: in its own
message and details; in the loss check's story (a step told by the check's own departure);
in a check not judged because it failed; in points it took over from a family its failure
disables; in an inferred value of its family."""

from __future__ import annotations

import json

import pytest

from moco_ref import selfcheck
from moco_ref.judge.invariants.loss import LOSS_CHECK_ID
from moco_ref.judge.loss_story import story_run, story_verdict
from moco_ref.judge.registry import all_checks
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import charge_disabled, rubric_from_mapping
from moco_ref.platforms.gradescope import writer as gradescope_writer
from moco_ref.platforms.prairielearn import writer as prairielearn_writer
from moco_ref.report import feedback, figures
from moco_ref.report.scoring import points_str
from moco_ref.report.text import INFERRED_FAMILIES

STYLES = ("lab", "builder", "components")
WITHHOLDING = ("after_due_date", "after_published", "hidden")
SECRET_POINTS = 7.31
MISCONCEPTION = "MISCONCEPTION-OF-THE-WITHHELD-CHECK"
EVIDENCE = "EVIDENCE-OF-THE-WITHHELD-CHECK"
INFERRED_VALUE = 0.98765


def _checks(style: str) -> list[str]:
    return [spec.check_id for spec in all_checks(style)]


CASES = [(style, check) for style in STYLES for check in _checks(style)]


def _report(withheld: str, style: str = "builder") -> SubmissionReport:
    """Every check passes but ``withheld``; its conclusion is carried wherever it can be."""
    ids = _checks(style)
    family = withheld.split("-", 1)[0]
    others = [c for c in ids if c != withheld and c != LOSS_CHECK_ID]
    waiting = next(c for c in others if c.split("-", 1)[0] != family)
    disabled = next(c for c in others if c.split("-", 1)[0] not in (family,
                                                                      waiting.split("-")[0]))
    results = []
    for check in ids:
        fam = check.split("-", 1)[0]
        if check == withheld:
            results.append(CheckResult(
                check, "the withheld check", fam, SECRET_POINTS, Status.FAILED,
                f"{MISCONCEPTION}: expected x, got {EVIDENCE}",
                {"misconception": MISCONCEPTION, "got": EVIDENCE,
                 "disables": [disabled.split("-", 1)[0]]}))
        elif check == LOSS_CHECK_ID:
            story = {"runs": [story_run(0, 0, []),
                              story_run(1, 8, [(withheld, f"{EVIDENCE} in the loss")],
                                        "the queue holding 16 keys")]}
            results.append(CheckResult(check, "the loss", fam, 2.0, Status.PASSED,
                                       story_verdict(story),
                                       {"loss_story": story, "loss_story_is_message": True}))
        elif check == waiting:
            results.append(CheckResult(check, "waits", fam, 2.0, Status.NOT_JUDGED,
                                       f"not judged: needs {withheld} ({EVIDENCE})",
                                       {"needs": withheld}))
        else:
            results.append(CheckResult(check, check, fam, 2.0, Status.PASSED, "ok"))
    inferred = {key: INFERRED_VALUE for key, families in INFERRED_FAMILIES.items()
                if family in families}
    return SubmissionReport(submission="/tmp/class/alice.py", style=style, gradable=True,
                            results=charge_disabled(results), inferred=inferred)


def _student_surfaces(report: SubmissionReport, rubric, withheld: str | None) -> dict[str, str]:
    """Each platform's text a student reads while ``withheld`` is not shown yet."""
    gradescope = gradescope_writer.gradescope_results(report, rubric=rubric)
    seen_before = [test for test in gradescope["tests"]
                   if withheld is None or _sooner(test["visibility"],
                                                   rubric.visibility_of(withheld))]
    self_checked = selfcheck.student_view(report, rubric)
    return {
        "gradescope": json.dumps({"output": gradescope["output"],
                                  "extra_data": gradescope["extra_data"],
                                  "tests": seen_before}, ensure_ascii=False),
        "prairielearn": json.dumps(prairielearn_writer.prairielearn_results(report, rubric),
                                   ensure_ascii=False),
        "feedback html": feedback.feedback_html(report, rubric, draw=False),
        "feedback md": feedback.feedback_markdown(report, rubric, draw=False),
        "self-check": selfcheck.plain_text(self_checked, rubric)
        + selfcheck.html_table(self_checked, rubric) + repr(self_checked),
    }


def _sooner(visibility: str, than: str) -> bool:
    order = ("visible", "after_due_date", "after_published", "hidden")
    return order.index(visibility) < order.index(than)


def _secrets(report: SubmissionReport, withheld: str) -> list[str]:
    (result,) = [r for r in report.results if r.check_id == withheld]
    return [MISCONCEPTION, EVIDENCE, withheld, str(INFERRED_VALUE),
            points_str(SECRET_POINTS), points_str(result.max_points)]


@pytest.mark.parametrize("visibility", WITHHOLDING)
@pytest.mark.parametrize(("style", "withheld"), CASES, ids=[f"{s}-{c}" for s, c in CASES])
def test_a_withheld_check_leaves_no_trace_on_any_student_surface(style, withheld, visibility,
                                                                 monkeypatch):
    monkeypatch.setattr(figures, "available", lambda: False)
    report = _report(withheld, style)
    rubric = rubric_from_mapping({"visibility": {withheld: visibility}})
    secrets = _secrets(report, withheld)
    for platform, text in _student_surfaces(report, rubric, withheld).items():
        found = [secret for secret in secrets if secret in text]
        assert not found, f"{platform} shows {found} of {withheld} ({visibility})"


def test_the_meta_report_does_carry_the_secrets_everywhere():
    """Meta: with nothing withheld every surface shows the check's evidence (so the property
    above is not passed by a report that never carried it), in the loss story, in the check
    waiting for it, and in the points it took over."""
    withheld = "I9-batch-not-own-negative"
    report = _report(withheld)
    rubric = rubric_from_mapping({})
    loss = next(r for r in report.results if r.check_id == LOSS_CHECK_ID)
    assert EVIDENCE in loss.message
    assert any(r.details.get("charged_to") == withheld for r in report.results)
    surfaces = _student_surfaces(report, rubric, None)
    for platform, text in surfaces.items():
        assert MISCONCEPTION in text and EVIDENCE in text, platform
