"""``grade_submission(single_run=True)`` (the autograder's one submission per run, issue 27)
stops the warm process once the submission is observed and before judging, so the two
phases' memory is never held at once; without it the warm process stays for the next one.
The peak itself is measured by ``benchmarks/test_memory_peak.py``, not here."""

from moco_ref.probe.options import GradeOptions
from moco_ref.run import pipeline


def _stubbed(monkeypatch, calls: list) -> None:
    monkeypatch.setattr(pipeline, "observe_in_sandbox",
                        lambda *args, **kwargs: calls.append("observed") or "run")
    monkeypatch.setattr(pipeline, "_stop_warm_processes", lambda: calls.append("stopped"))

    def judged(target, options, run):
        calls.append("judged")
        return pipeline.SubmissionReport(target, "lab", gradable=False)

    monkeypatch.setattr(pipeline, "_report", judged)


def test_single_run_stops_the_warm_process_before_judging(monkeypatch, tmp_path):
    calls: list = []
    _stubbed(monkeypatch, calls)
    pipeline.grade_submission(str(tmp_path / "s.py"), GradeOptions(style="lab"),
                              single_run=True)
    assert calls == ["observed", "stopped", "judged"]


def test_by_default_the_warm_process_stays(monkeypatch, tmp_path):
    calls: list = []
    _stubbed(monkeypatch, calls)
    pipeline.grade_submission(str(tmp_path / "s.py"), GradeOptions(style="lab"))
    assert calls == ["observed", "judged"]


def test_the_autograder_grades_in_single_run_mode(monkeypatch, tmp_path):
    from moco_ref.judge.rubric import DEFAULT_RUBRIC
    from moco_ref.platforms import course

    (tmp_path / "train.py").write_text("def train_moco():\n    pass\n")
    seen = {}

    def graded(target, options, **kwargs):
        seen.update(kwargs)
        return pipeline.SubmissionReport(target, "lab", gradable=False)

    monkeypatch.setattr(course, "sandbox_refusal", lambda *args, **kwargs: "")
    monkeypatch.setattr(pipeline, "grade_submission", graded)
    course.grade_folder(tmp_path, {}, DEFAULT_RUBRIC)
    assert seen.get("single_run") is True
