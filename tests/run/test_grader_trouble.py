"""A submission is never charged for the grader's trouble: time spent waiting for a
neighbour's judging is not its time, and a report made under the grader's own trouble is
graded again alone, never cached and never the student's grade."""

from __future__ import annotations

import threading
import time

from moco_ref.judge.results import SubmissionReport
from moco_ref.probe.options import GradeOptions
from moco_ref.run import pipeline
from moco_ref.run.batch import grade_status
from moco_ref.run.cache import report_is_cacheable


def test_waiting_for_the_judge_lock_is_not_charged():
    clock = pipeline.GraderClock(seconds=1.0)
    holder_ready, release = threading.Event(), threading.Event()

    def neighbour():
        with pipeline._JUDGE_LOCK:
            holder_ready.set()
            release.wait(5)

    thread = threading.Thread(target=neighbour)
    thread.start()
    holder_ready.wait(5)
    threading.Timer(0.5, release.set).start()
    with clock.working() as deadline:  # waits ~0.5 s for the neighbour
        assert deadline - time.monotonic() > 0.9  # the whole second is still ours
    thread.join()
    assert clock.left > 0.9


def _report(target, trouble=""):
    return SubmissionReport(target, "lab", gradable=not trouble, grader_trouble=trouble)


def test_a_troubled_report_is_graded_again_alone_and_only_the_final_one_is_told(monkeypatch):
    calls, told = [], []
    troubled_once = {"b.py"}

    def fake(target, options=None, *, isolation=None, helpers=True):
        calls.append((target, threading.active_count()))
        if target in troubled_once:
            troubled_once.discard(target)
            return _report(target, "internal error: the warm process died")
        return _report(target)

    monkeypatch.setattr(pipeline, "grade_submission", fake)
    reports = pipeline.grade_tasks([(t, GradeOptions()) for t in ("a.py", "b.py", "c.py")],
                                   jobs=2, on_report=lambda r: told.append(r.submission))
    assert [r.grader_trouble for r in reports] == ["", "", ""]
    assert [c[0] for c in calls].count("b.py") == 2 and calls[-1][0] == "b.py"
    assert sorted(told) == ["a.py", "b.py", "c.py"]  # once each, the final report


def test_persistent_trouble_is_for_staff_never_a_grade_nor_cached(monkeypatch):
    monkeypatch.setattr(pipeline, "grade_submission",
                        lambda target, options=None, **_: _report(target, "internal error: x"))
    (report,) = pipeline.grade_tasks([("a.py", GradeOptions())])
    assert report.grader_trouble and "report it to the course staff" in report.notes[-1]
    assert grade_status(report) == "grader error"
    assert not report_is_cacheable(report)
    assert report_is_cacheable(_report("b.py"))
    assert SubmissionReport.from_dict(report.to_dict()).grader_trouble == report.grader_trouble
