"""Visibility means what the platform means: a course with a rubric of total 50, one check
``hidden`` (I9, the batch among its own negatives) and one ``after_due_date`` (I3's FIFO), and a
submission whose bug is the hidden check's. Nothing a student can see now carries the hidden
check's id, points, evidence, misconception or the inferred loss form that names the bug; the
after-due-date check's evidence only where the platform holds it back (Gradescope's tests of
that visibility) or once the teacher releases it (feedback pages, PrairieLearn).

The report is built here, without grading (like ``tests/tools/test_autograder.py``)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from moco_ref.judge.registry import all_checks
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import rubric_from_mapping
from moco_ref.platforms.gradescope.writer import gradescope_problems, gradescope_results
from moco_ref.platforms.prairielearn.writer import prairielearn_problems, prairielearn_results
from moco_ref.report import feedback
from moco_ref.report.scoring import points_str

HIDDEN = "I9-batch-not-own-negative"
LATER = "I3-fifo-keeps-newest"
HIDDEN_MESSAGE = "the current batch's own keys were among its negatives (secret evidence)"
LATER_MESSAGE = "the queue kept the oldest keys (evidence for after the due date)"
LOSS_FORM = "the batch's own keys appended to the queue's negatives"
RUBRIC = rubric_from_mapping({
    "total": 50,
    "visibility": {"I9": "hidden", LATER: "after_due_date"},
    "output": {"show_submission_output": True},
})
RELEASED = replace(RUBRIC, released=True)


def _report() -> SubmissionReport:
    points = RUBRIC.points("lab")
    results = []
    for spec in all_checks("lab"):
        status, message = Status.PASSED, "ok"
        if spec.check_id == HIDDEN:
            status, message = Status.FAILED, HIDDEN_MESSAGE
        elif spec.check_id == LATER:
            status, message = Status.FAILED, LATER_MESSAGE
        results.append(CheckResult(spec.check_id, spec.title, spec.family,
                                   points[spec.check_id], status, message))
    return SubmissionReport(
        submission="/work/class/alice/lab.py", style="lab", gradable=True, results=results,
        inferred={"style": "lab", "m": 0.99, "capacity": 256, "batch_size": 32,
                  "temperature": 0.2, "loss_form": LOSS_FORM},
        stdout="epoch 1 loss 4.2", wall_seconds=2.0)


@pytest.fixture
def report() -> SubmissionReport:
    return _report()


def _result(report: SubmissionReport, check_id: str) -> CheckResult:
    return next(r for r in report.results if r.check_id == check_id)


def _hidden_traces(report: SubmissionReport) -> list[str]:
    """What would tell the hidden check's outcome: its id, title, message, the loss form."""
    hidden = _result(report, HIDDEN)
    return [HIDDEN, hidden.title, HIDDEN_MESSAGE, "among its negatives", LOSS_FORM,
            "own keys appended"]


def _states_total(text: str, report: SubmissionReport) -> bool:
    """Whether ``text`` says the total (which counts the withheld checks' points)."""
    total = re.escape(points_str(report.score))
    return re.search(rf"(?<![\d.]){total}\s*/\s*{points_str(report.max_score)}\b",
                     text) is not None


def test_the_scenario_is_what_the_tests_assume(report):
    assert report.max_score == 50 and report.score < 50
    assert RUBRIC.visibility_of(HIDDEN) == "hidden"
    assert RUBRIC.visibility_of(LATER) == "after_due_date"
    assert not RUBRIC.shown_now(HIDDEN) and not RUBRIC.shown_now(LATER)
    assert not RELEASED.shown_now(HIDDEN) and RELEASED.shown_now(LATER)
    assert _states_total(f"{points_str(report.score)} / 50", report)


# --------------------------------------------------------------------------- Gradescope


def test_gradescope_output_and_visible_tests_carry_nothing_of_the_hidden_check(report):
    data = gradescope_results(report, rubric=RUBRIC)
    assert gradescope_problems(data) == []
    visible = [t for t in data["tests"] if t["visibility"] == "visible"]
    seen = data["output"] + json.dumps(visible, ensure_ascii=False)
    for trace in _hidden_traces(report):
        assert trace not in seen, trace
    assert points_str(_result(report, HIDDEN).max_points) not in data["output"]
    assert not _states_total(data["output"], report)
    assert "loss form" not in data["output"]
    # the rest of the inferred values, whose families are all visible, are still shown
    assert "batch size=32" in data["output"]
    # the stored extra data says no more than the output
    assert LOSS_FORM not in json.dumps(data["extra_data"], ensure_ascii=False)


def test_gradescope_keeps_the_hidden_check_as_a_hidden_test_and_the_true_total(report):
    data = gradescope_results(report, rubric=RUBRIC)
    by_id = {t["name"].split(":")[0]: t for t in data["tests"]}
    assert by_id[HIDDEN]["visibility"] == "hidden" and by_id[HIDDEN]["score"] == 0
    assert HIDDEN_MESSAGE in by_id[HIDDEN]["output"]  # Gradescope never shows it to students
    assert data["score"] == pytest.approx(report.score)  # the gradebook's; hidden by Gradescope
    shown = sum(t["score"] for t in data["tests"] if t["visibility"] == "visible")
    most = sum(t["max_score"] for t in data["tests"] if t["visibility"] == "visible")
    assert f"**{points_str(round(shown, 2))} / {points_str(round(most, 2))}**" in data["output"]
    # the autograder's own stdout states the total: not shown while tests are withheld
    assert data["stdout_visibility"] == "hidden"
    assert data["visibility"] == "visible"


def test_gradescope_after_due_date_evidence_only_in_tests_of_that_visibility(report):
    data = gradescope_results(report, rubric=RUBRIC)
    carrying = [t["visibility"] for t in data["tests"] if LATER_MESSAGE in t["output"]]
    assert carrying == ["after_due_date"]
    assert LATER_MESSAGE not in data["output"] and LATER not in data["output"]
    # nor an inferred value of the withheld family (the queue's capacity is I3's)
    assert "capacity" not in data["output"] and "m=0.99" in data["output"]
    for test in data["tests"]:
        if test["visibility"] == "visible":
            assert LATER_MESSAGE not in test["output"] and LATER not in test["name"]


def test_gradescope_with_every_check_visible_states_the_total_and_all_inferred(report):
    rubric = rubric_from_mapping({"total": 50})
    data = gradescope_results(report, rubric=rubric)
    assert _states_total(data["output"], report)
    assert LOSS_FORM in data["output"]


# --------------------------------------------------------------------------- PrairieLearn


def test_prairielearn_leaves_the_hidden_and_the_later_check_out(report):
    data = prairielearn_results(report, RUBRIC)
    assert prairielearn_problems(data) == []
    names = [t["name"].split(":")[0] for t in data["tests"]]
    assert HIDDEN not in names and LATER not in names
    assert len(names) == len([r for r in report.results if r.status is not Status.NOT_APPLICABLE]
                             ) - 2
    text = json.dumps(data, ensure_ascii=False)
    for trace in [*_hidden_traces(report), LATER_MESSAGE]:
        assert trace not in text, trace
    assert not _states_total(data["message"], report)
    # the score counts what the student is shown: no left-out check can be worked out of it
    earned = sum(t["points"] for t in data["tests"])
    most = sum(t["max_points"] for t in data["tests"])
    assert 0 < data["score"] <= 1
    assert data["score"] == pytest.approx(earned / most, abs=1e-6)


def test_prairielearn_shows_the_later_check_once_released(report):
    data = prairielearn_results(report, RELEASED)
    assert prairielearn_problems(data) == []
    by_id = {t["name"].split(":")[0]: t for t in data["tests"]}
    assert LATER in by_id and HIDDEN not in by_id
    assert LATER_MESSAGE in by_id[LATER]["output"]
    assert HIDDEN_MESSAGE not in json.dumps(data, ensure_ascii=False)
    earned = sum(t["points"] for t in data["tests"])
    most = sum(t["max_points"] for t in data["tests"])
    assert data["score"] == pytest.approx(earned / most, abs=1e-6) and data["score"] < 1


# --------------------------------------------------------------------------- feedback pages


@pytest.mark.parametrize("render", [feedback.feedback_html, feedback.feedback_markdown],
                         ids=["html", "md"])
def test_a_feedback_page_keeps_after_due_date_evidence_back_until_released(report, render):
    page = render(report, RUBRIC, draw=False)
    for trace in [*_hidden_traces(report), LATER_MESSAGE]:
        assert trace not in page, trace
    assert "loss form" not in page
    assert not _states_total(page, report)
    assert "shown after the due date" in page  # named, with when it is shown

    released = render(report, RELEASED, draw=False)
    assert LATER_MESSAGE in released
    assert _states_total(released, report)
    for trace in _hidden_traces(report):
        assert trace not in released, trace  # hidden stays hidden
    assert "1 check(s) the course keeps hidden" in released


def test_the_feedback_page_s_score_element_counts_only_what_is_shown(report):
    from tests.report.test_feedback import Page

    page = Page(feedback.feedback_html(report, RUBRIC, draw=False))
    shown = [r for r in report.results if r.check_id not in (HIDDEN, LATER)]
    assert page.score["data-score"] == points_str(round(sum(r.points for r in shown), 2))
    assert page.score["data-max-score"] == points_str(
        round(sum(r.max_points for r in shown), 2))
    assert page.score["data-total"] == "withheld"
    released = Page(feedback.feedback_html(report, RELEASED, draw=False))
    assert released.score["data-score"] == points_str(report.score)
    assert released.score["data-max-score"] == "50"


def test_grade_release_feedback_writes_the_released_page(tmp_path, monkeypatch, report):
    """``moco-ref grade FILE --rubric R --feedback md [--release-feedback]``, the grading
    itself replaced by the report built here."""
    from moco_ref.cli import grade, main
    from moco_ref.run import pipeline

    submission = tmp_path / "lab.py"
    submission.write_text("x = 1\n", encoding="utf-8")
    rubric = tmp_path / "rubric.toml"
    rubric.write_text(f'total = 50\n[visibility]\nI9 = "hidden"\n"{LATER}" = "after_due_date"\n',
                      encoding="utf-8")
    graded = replace(report, submission=str(submission))
    monkeypatch.setattr(grade, "warm_up", lambda *a, **k: None)
    monkeypatch.setattr(grade, "isolation_refusal", lambda *a, **k: "")
    monkeypatch.setattr(pipeline, "grade_many", lambda *a, **k: [graded])
    pages = {}
    for flags in ((), ("--release-feedback",)):
        out = tmp_path / f"page{len(flags)}.md"
        main(["grade", str(submission), "--rubric", str(rubric), "--isolation", "processes",
              "--feedback", "md", "--feedback-out", str(out), "--json", *flags])
        pages[flags] = out.read_text(encoding="utf-8")
    assert LATER_MESSAGE not in pages[()] and LATER_MESSAGE in pages[("--release-feedback",)]
    assert all(HIDDEN_MESSAGE not in page for page in pages.values())


def test_batch_grading_hands_the_released_rubric_to_the_pages(tmp_path, monkeypatch):
    """``moco-ref grade DIR --out OUT --feedback html --release-feedback``: the rubric that
    reaches the batch's pages is released (the grading itself stopped before it starts)."""
    from moco_ref.cli import grade, main
    from moco_ref.run import batch
    from moco_ref.run.targets import TargetError

    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "lab.py").write_text("x = 1\n", encoding="utf-8")
    seen = []

    def stop(*args, rubric=None, **kwargs):
        seen.append(rubric)
        raise TargetError("stopped here")

    monkeypatch.setattr(grade, "warm_up", lambda *a, **k: None)
    monkeypatch.setattr(grade, "isolation_refusal", lambda *a, **k: "")
    monkeypatch.setattr(batch, "grade_folder", stop)
    for flags in ((), ("--release-feedback",)):
        assert main(["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out"),
                     "--isolation", "processes", "--feedback", "html", *flags]) == 2
    assert [rubric.released for rubric in seen] == [False, True]
