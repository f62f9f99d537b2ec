"""The sandboxed runner: each submission in its own process, with a timeout, a memory limit, a
scratch working directory and capped output; whatever goes wrong becomes a report, never a
crash of the grader. Failure cases are graded side by side (``grade_tasks``) to save time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from grading_stubs.fixtures import GOOD_WARMUP, stubbed, write  # noqa: F401 - fixture

from moco_ref.conformance.options import GradeOptions
from moco_ref.conformance.results import Status
from moco_ref.grading.runner import _report_from_run, _WorkerRun, grade_submission, grade_tasks

MESSY_BUT_CORRECT = """
import os, subprocess, sys
for _ in range(400):
    print("x" * 999)                      # 400 kB on stdout
sys.stderr.write("a warning\\n")
open("junk.txt", "w").write("left in the working directory")
open({cwd_file!r}, "w").write(os.getcwd())
child = subprocess.Popen(["sleep", "120"])  # a grandchild that would outlive us
open({pid_file!r}, "w").write(str(child.pid))
"""

NOT_GRADABLE = {  # source, options, what the traceback must say
    "import_error": ("import surely_no_such_module_xyz\n", {},
                     "ModuleNotFoundError: No module named 'surely_no_such_module_xyz'"),
    "hard_exit": ("import os\nos._exit(3)\n", {},
                  "exited with code 3 before any observation was recorded"),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", {},
                 "was killed by SIGSEGV before any observation"),
    "memory_hog": ("hog = bytearray(16 * 2**30)\n" + GOOD_WARMUP, {}, "MemoryError"),
    "sleeps_at_import": ("import time\ntime.sleep(600)\n", {"timeout": 3.0},
                         "timed out after 3 s while loading the submission"),
}


def test_messy_but_correct_submission_is_graded_and_cleaned_up(tmp_path, stubbed):  # noqa: F811
    cwd_file, pid_file = tmp_path / "cwd.txt", tmp_path / "pid.txt"
    source = MESSY_BUT_CORRECT.format(cwd_file=str(cwd_file), pid_file=str(pid_file))
    report = grade_submission(write(tmp_path, "messy.py", source + GOOD_WARMUP))

    assert report.gradable, report.traceback
    assert report.score == report.max_score == 3.0
    assert report.inferred == {"m": 0.9, "capacity": 4, "order": "lab"}
    assert report.style == "lab" and report.wall_seconds > 0
    # stdout flood: head and tail kept, the middle cut and counted
    assert "bytes of output cut" in report.stdout
    assert report.stdout.startswith("x" * 999) and report.stdout.rstrip().endswith("x" * 999)
    assert len(report.stdout) < 21_000 and report.stderr == "a warning\n"
    # a scratch working directory, removed afterwards
    scratch = Path(cwd_file.read_text())
    assert scratch != Path.cwd() and not scratch.exists() and not Path("junk.txt").exists()
    # the whole process group is killed: the grandchild is gone (or a zombie awaiting init)
    status = Path(f"/proc/{int(pid_file.read_text())}/status")
    deadline = time.monotonic() + 5
    while status.exists() and "State:\tZ" not in status.read_text():
        assert time.monotonic() < deadline, "a grandchild survived grading"
        time.sleep(0.1)


def test_failures_are_not_gradable_with_a_traceback(tmp_path, stubbed):  # noqa: F811
    tasks = [
        (write(tmp_path, f"{name}.py", source), GradeOptions(**options))
        for name, (source, options, _) in NOT_GRADABLE.items()
    ]
    started = time.monotonic()
    reports = grade_tasks(tasks, jobs=3)
    elapsed = time.monotonic() - started
    for (name, (_, _, evidence)), report in zip(NOT_GRADABLE.items(), reports, strict=True):
        assert not report.gradable, name
        assert report.results == [] and report.score == 0, name
        assert evidence in report.traceback, f"{name}: {report.traceback}"
    # 5 children, 3 at a time: well under 5 sequential runs
    assert elapsed < sum(report.wall_seconds for report in reports)


def test_timeout_while_observed_times_out_every_check_of_the_style(stubbed):  # noqa: F811
    run = _WorkerRun()
    run.timed_out = True
    run.progress = {"stage": "observe", "style": "lab", "notes": ["cell 3: skipped …"]}
    report = _report_from_run("slow.py", GradeOptions(timeout=7), run)
    assert report.gradable and report.notes == ["cell 3: skipped …"]
    assert [(r.check_id, r.status) for r in report.results] == [
        ("W1-warmup-fifo", Status.TIMEOUT),
        ("W2-warmup-ema", Status.TIMEOUT),
    ]
    assert "did not finish within 7 s" in report.results[0].message
    assert report.score == 0 and report.max_score == 3


def test_judge_errors_are_reported_not_raised(stubbed, monkeypatch):  # noqa: F811
    import sys

    def broken_judge(observations, style, options):
        raise RuntimeError("judge bug")

    monkeypatch.setattr(sys.modules["moco_ref.conformance.judge"], "judge", broken_judge)
    run = _WorkerRun()
    run.record = {"gradable": True, "style": "lab", "notes": [], "observations": {}}
    report = _report_from_run("x.py", GradeOptions(), run)
    assert not report.gradable and "internal error while judging" in report.traceback


@pytest.mark.slow
def test_timeout_while_observed_end_to_end(tmp_path, stubbed):  # noqa: F811
    source = "import time\ndef moco_warmup():\n    time.sleep(600)\n"
    started = time.monotonic()
    report = grade_submission(write(tmp_path, "slow.py", source), GradeOptions(timeout=20))
    assert time.monotonic() - started < 35
    assert report.gradable and {r.status for r in report.results} == {Status.TIMEOUT}
