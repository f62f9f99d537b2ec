"""A submission is never charged for the grader's trouble: time spent waiting for a
neighbour's judging is not its time, and a report made under the grader's own trouble is
graded again alone, never cached and never the student's grade."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from moco_ref.judge.results import SubmissionReport
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import Stage
from moco_ref.run import pipeline
from moco_ref.run.batch import grade_status
from moco_ref.run.cache import report_is_cacheable
from moco_ref.sandbox.attempt import Attempt, starvation
from moco_ref.sandbox.observation import LOAD_TIMED_OUT


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


# --------------------------------------------------------------------------- starvation


@pytest.mark.parametrize("wall, cpu, run_queue, starved", [
    (10.0, 0.5, 9.0, True),  # waited for a CPU nearly all the time
    (10.0, 3.0, 4.0, True),  # under a third on a CPU, most of the rest waiting
    (10.0, 0.0, 0.1, False),  # slept until its time ran out
    (10.0, 2.0, 3.0, False),  # mostly asleep, some waiting: its own timeout
    (10.0, 4.0, 6.0, False),  # it had over a third of its time on a CPU
    (10.0, 9.9, 70.0, False),  # 8 threads queueing on its own CPU: it had its CPU
    (10.0, 0.5, None, False),  # no schedstat: never starvation
    (10.0, None, 9.0, False),  # no EXIT frame
    (0.0, 0.0, 0.0, False),
])
def test_starvation_is_little_cpu_and_mostly_waiting_to_run(wall, cpu, run_queue, starved):
    assert bool(starvation(wall, cpu, run_queue)) is starved


def _attempt(*, timed_out=True, part_timed_out=False, cpu=0.4, run_queue=4.5, wall=5.0,
             stage=None):
    return Attempt(stage=stage, timed_out=timed_out, part_timed_out=part_timed_out,
                   wall_seconds=wall, supervisor_status=0,
                   exit={"status": 9, "cpu_seconds": cpu, "run_queue_seconds": run_queue})


def test_only_a_job_whose_time_ran_out_can_be_starved():
    assert _attempt().starved()
    assert _attempt(timed_out=False, part_timed_out=True).starved()
    assert not _attempt(timed_out=False).starved()  # it ended in time
    assert not _attempt(run_queue=0.1).starved()  # it slept


def _observed(monkeypatch, attempt):
    from moco_ref.sandbox import observation

    class Warm:
        namespaces = "processes"

    monkeypatch.setattr(observation, "current_zygote", lambda **_: Warm())
    monkeypatch.setattr(observation, "run_attempt", lambda *args, **kwargs: attempt)
    return observation.observe_in_sandbox("a.py", GradeOptions(style="lab", timeout=5))


def test_a_starved_load_is_the_grader_s_trouble_and_a_sleeping_one_the_submission_s(
        monkeypatch):
    starved = _observed(monkeypatch, _attempt())
    assert starved.grader_trouble.startswith("the job was starved of CPU")
    assert "the grader's trouble" in starved.failure
    asleep = _observed(monkeypatch, _attempt(run_queue=0.0))
    assert asleep.grader_trouble == "" and asleep.failure.startswith(LOAD_TIMED_OUT)
    assert "grader" not in asleep.failure


def test_a_starved_part_makes_the_whole_report_the_grader_s_trouble(monkeypatch):
    stage = Stage(style="lab")
    run = _observed(monkeypatch, replace(_attempt(stage=stage), started_part="moco_warmup"))
    assert run.failure == "" and run.grader_trouble
    assert all(gap.timed_out and "the grader's trouble" in gap.reason
               for gap in run.missing.values())
    report = pipeline._report_shell("a.py", GradeOptions(style="lab"), run)
    assert report.grader_trouble == run.grader_trouble and not report_is_cacheable(report)
