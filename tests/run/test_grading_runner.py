"""The sandboxed runner: each submission in its own process, with timeouts (per job and per
observed part), a memory limit, a scratch working directory and capped output; whatever goes
wrong becomes a report, never a crash of the grader, and no process is left behind. Failure
cases are graded side by side (``grade_tasks``) to save time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from moco_ref.judge.results import Status
from moco_ref.probe.options import GradeOptions
from moco_ref.run.pipeline import grade_submission, grade_tasks
from moco_ref.sandbox import client
from tests.helpers.grading_stubs.fixtures import GOOD_WARMUP, stubbed, write  # noqa: F401 - fixture
from tests.helpers.grading_stubs.leftovers import TAG, wait_for_no_leftovers

MESSY_BUT_CORRECT = """
import os, subprocess, sys
for _ in range(400):
    print("x" * 999)                      # 400 kB on stdout
sys.stderr.write("a warning\\n")
open("junk.txt", "w").write("left in the working directory")
sys.stderr.write("cwd=" + os.getcwd() + "\\n")
try:
    open({outside!r}, "w").write("written outside the working directory")
except OSError as error:
    sys.stderr.write(error.strerror + "\\n")
child = subprocess.Popen(["sleep", "120"])  # a grandchild that would outlive us
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
    "reference_import": ("from moco_ref import MoCoTrainer\n" + GOOD_WARMUP, {},
                         "moco-ref refuses to let a submission import its reference"),
}

SLOW_WARMUP = "import time\ndef moco_warmup():\n    time.sleep(600)\n"
EXIT_IN_WARMUP = "import os\ndef moco_warmup():\n    os._exit(0)\n"


def test_messy_but_correct_submission_is_graded_and_cleaned_up(tmp_path, stubbed):  # noqa: F811
    outside = tmp_path / "outside.txt"
    source = MESSY_BUT_CORRECT.format(outside=str(outside))
    report = grade_submission(write(tmp_path, "messy.py", source + GOOD_WARMUP))

    assert report.gradable, report.traceback
    assert report.score == report.max_score == 3.0
    assert report.inferred == {"m": 0.9, "capacity": 4, "order": "lab"}
    assert report.style == "lab" and report.wall_seconds > 0
    # stdout flood: head and tail kept, the middle cut and counted
    assert "bytes of output cut" in report.stdout
    assert report.stdout.startswith("x" * 999) and report.stdout.rstrip().endswith("x" * 999)
    assert len(report.stdout) < 21_000
    lines = report.stderr.splitlines()
    assert lines[0] == "a warning"
    # a scratch working directory, removed afterwards
    scratch = Path(lines[1].removeprefix("cwd="))
    assert scratch != Path.cwd() and not scratch.exists() and not Path("junk.txt").exists()
    # processes mode (the stand-in harness): nothing stops the write; under bwrap the same
    # write fails (test_grading_adversarial::test_nothing_appears_outside_the_scratch)
    assert lines[2:] == [] and outside.exists()
    assert wait_for_no_leftovers() == []  # the `sleep 120` grandchild is gone


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_failures_are_not_gradable_with_a_traceback(tmp_path, stubbed):  # noqa: F811
    tasks = [
        (write(tmp_path, f"{name}.py", source), GradeOptions(**options))
        for name, (source, options, _) in NOT_GRADABLE.items()
    ]
    reports = grade_tasks(tasks, jobs=3)
    for (name, (_, _, evidence)), report in zip(NOT_GRADABLE.items(), reports, strict=True):
        assert not report.gradable, name
        assert report.results == [] and report.score == 0, name
        assert evidence in report.traceback, f"{name}: {report.traceback}"
    assert wait_for_no_leftovers() == []


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_slow_part_times_out_and_the_rest_is_observed_anew(tmp_path, stubbed):  # noqa: F811
    """Per-check timeout: moco_warmup hangs; its checks time out after --check-timeout, the
    other part (train_moco) is observed in a fresh process within the job's time."""
    options = GradeOptions(timeout=30, check_timeout=2)
    started = time.monotonic()
    report = grade_submission(write(tmp_path, "slow.py", SLOW_WARMUP), options)
    assert time.monotonic() - started < 20
    assert report.gradable, report.traceback
    assert [(r.check_id, r.status) for r in report.results] == [
        ("W1-warmup-fifo", Status.TIMEOUT),
        ("W2-warmup-ema", Status.TIMEOUT),
        ("B1-builder-only", Status.NOT_APPLICABLE),
    ]
    assert "did not finish within its 2 s (--check-timeout)" in report.results[0].message
    assert "--- process 2 (parts train_moco) ---" in report.stdout
    assert report.score == 0 and report.max_score == 3
    assert wait_for_no_leftovers() == []


def test_the_job_timeout_marks_unfinished_parts_timeout(tmp_path, stubbed):  # noqa: F811
    options = GradeOptions(timeout=3, check_timeout=None)
    report = grade_submission(write(tmp_path, "slow.py", SLOW_WARMUP), options)
    assert report.gradable, report.traceback
    statuses = {r.check_id: r.status for r in report.results}
    assert statuses["W1-warmup-fifo"] is statuses["W2-warmup-ema"] is Status.TIMEOUT
    assert "did not finish within 3 s of wall-clock time" in report.results[0].message


def test_a_process_that_dies_in_a_part_fails_that_part_only(tmp_path, stubbed):  # noqa: F811
    report = grade_submission(write(tmp_path, "exits.py", EXIT_IN_WARMUP))
    assert report.gradable, report.traceback
    results = {r.check_id: r for r in report.results}
    assert results["W1-warmup-fifo"].status is Status.ERROR
    assert "exited with code 0 while it was being observed" in results["W1-warmup-fifo"].message


def test_judge_errors_are_reported_not_raised(tmp_path, stubbed, monkeypatch):  # noqa: F811
    import sys

    def broken_judge(observations, style, options, **_):
        raise RuntimeError("judge bug")

    monkeypatch.setattr(sys.modules["moco_ref.run.pipeline"], "judge", broken_judge)
    report = grade_submission(write(tmp_path, "ok.py", GOOD_WARMUP))
    assert not report.gradable and "internal error while judging" in report.traceback


def test_the_tag_reaches_the_zygote(stubbed):  # noqa: F811
    """The leftover scan relies on the test run's tag in every zygote's environment."""
    zygote = client.zygote_for(client.child_environment())
    environ = Path(f"/proc/{zygote.process.pid}/environ").read_bytes()
    assert f"MOCO_REF_TEST_RUN={TAG}".encode() in environ.split(b"\0")


@pytest.mark.parametrize("mode", ["processes"])
def test_without_namespaces_grandchildren_are_still_killed(tmp_path, stubbed, monkeypatch,  # noqa: F811
                                                           mode):
    monkeypatch.setenv(client.ISOLATION_VARIABLE, mode)
    source = ("import subprocess\nsubprocess.Popen(['sleep', '120'], start_new_session=True)\n"
              + GOOD_WARMUP)
    report = grade_submission(write(tmp_path, "escapes.py", source))
    assert report.gradable and report.score == 3
    assert wait_for_no_leftovers() == []
