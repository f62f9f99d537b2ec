"""A fair CPU share, measured on real jobs: a job starved of CPU by other processes until its
time runs out is the grader's trouble, while one that slept until then timed out by itself;
and beyond one job per CPU the scheduler weighs jobs, not threads (each job's supervisor is a
session of its own, so with autogroup on, outside a CPU cgroup, each job is one scheduling
group; where the scheduler shares by thread, measured on plain processes, that test skips)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from moco_ref.judge.results import Status
from moco_ref.probe.options import GradeOptions
from moco_ref.run.cache import report_is_cacheable
from moco_ref.run.pipeline import grade_submission, observe_sandboxed
from moco_ref.sandbox import attempt, client, observation

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="schedstat, affinity and autogroups are Linux's"),
              pytest.mark.full]  # the second tier: starts the real sandbox per case

HOGS = 6  # busy processes, each a session (a scheduling group) of its own, on the job's CPU
BUSY = "def moco_warmup():\n    while True:\n        pass\n"
ASLEEP = "import time\n\n\ndef moco_warmup():\n    time.sleep(1000)\n"


class _OneCpuForAll:
    """Every job on the same CPU (the real ``CpuShares`` gives each its own while it can)."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu

    def take(self) -> int:
        return self.cpu

    def give_back(self, cpu) -> None:
        pass


@pytest.fixture
def the_cpu(monkeypatch):
    """One CPU every job of the test runs on, with the warm process started beforehand."""
    cpu = max(os.sched_getaffinity(0))
    monkeypatch.setattr(attempt, "CPU_SHARES", _OneCpuForAll(cpu))
    client.current_zygote(isolation="processes")
    return cpu


@pytest.fixture
def hogs(the_cpu):
    """``HOGS`` busy processes pinned to the jobs' CPU, each in a session of its own."""
    started = [subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{the_cpu}}})\n"
                               "while True:\n    pass\n"],
        start_new_session=True) for _ in range(HOGS)]
    time.sleep(0.3)
    yield started
    for hog in started:
        hog.kill()
    for hog in started:
        hog.wait(10)


def _graded(tmp_path, monkeypatch, name: str, source: str):
    """The report, and each attempt's figures (wall, CPU and run-queue seconds)."""
    target = tmp_path / name
    target.write_text(source, encoding="utf-8")
    figures, run = [], observation.run_attempt

    def watched(*args, **kwargs):
        made = run(*args, **kwargs)
        figures.append((made.wall_seconds, (made.exit or {}).get("cpu_seconds"),
                        (made.exit or {}).get("run_queue_seconds")))
        return made

    monkeypatch.setattr(observation, "run_attempt", watched)
    report = grade_submission(str(target), GradeOptions(style="lab", timeout=5,
                                                        check_timeout=0),
                              isolation="processes")
    return report, figures


def test_a_job_starved_until_its_timeout_is_the_grader_s_trouble(tmp_path, monkeypatch, hogs):
    report, figures = _graded(tmp_path, monkeypatch, "busy.py", BUSY)
    assert report.grader_trouble.startswith("the job was starved of CPU by other processes"), \
        figures
    assert not report_is_cacheable(report)
    timed_out = [r for r in report.results if r.status is Status.TIMEOUT]
    assert timed_out and all("the grader's trouble" in r.message for r in timed_out)


def test_a_job_that_slept_until_its_timeout_timed_out_by_itself(tmp_path, monkeypatch, hogs):
    report, figures = _graded(tmp_path, monkeypatch, "asleep.py", ASLEEP)  # the same hogs
    assert report.grader_trouble == "", figures
    timed_out = [r for r in report.results if r.status is Status.TIMEOUT]
    assert timed_out and not any("grader" in r.message for r in timed_out)


SHARE = """\
import hashlib
import threading
import time

START, SECONDS, THREADS, CPU = {start!r}, {seconds!r}, {threads!r}, {cpu!r}


def _spin(stop):
    block = bytes(1 << 20)
    while time.time() < stop:
        hashlib.sha256(block).digest()  # hashing releases the GIL: every thread is busy


def moco_warmup():
    while time.time() < START:
        time.sleep(0.01)
    cpu = time.process_time()
    threads = [threading.Thread(target=_spin, args=(START + SECONDS,))
               for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {{"FIFO": [], "EMA": [], "temperature_probabilities": {{}},
             "cpu": time.process_time() - cpu, "group": _autogroup()}}


def _autogroup():
    with open("/proc/self/autogroup") as handle:
        return handle.read().partition(" ")[0]  # empty in the kernel's default group


if __name__ == "__main__":  # the control: the same work as a plain process, no grader
    import os
    os.sched_setaffinity(0, {{CPU}})
    print(moco_warmup()["cpu"])
"""


def _cpu_seconds_of(tmp_path, cpu: int, seconds: float, *, graded: bool) -> dict[int, dict]:
    """What a job of 1 busy thread and one of 8 got of one CPU in the same ``seconds``:
    graded jobs, or (``graded=False``) the same scripts as plain processes, each in a
    session of its own."""
    start, made = time.time() + (3.0 if graded else 1.0), {}

    def observe(threads: int) -> None:
        target = tmp_path / f"threads_{threads}_{graded}.py"
        target.write_text(SHARE.format(start=start, seconds=seconds, threads=threads,
                                       cpu=cpu), encoding="utf-8")
        if graded:
            record = observe_sandboxed(str(target), GradeOptions(style="lab", timeout=30),
                                       isolation="processes")
            made[threads] = record["observations"]["moco_warmup"]["result"]
        else:
            done = subprocess.run([sys.executable, str(target)], capture_output=True,
                                  text=True, start_new_session=True, timeout=30, check=True)
            made[threads] = {"cpu": float(done.stdout)}

    jobs = [threading.Thread(target=observe, args=(threads,)) for threads in (1, 8)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    return made


@pytest.fixture
def sessions_weighed(tmp_path, the_cpu):
    """Skips unless this machine's scheduler shares a CPU by session: measured on plain
    processes, since a CPU cgroup (as in most containers and CI runners) makes the kernel
    ignore autogroups whatever its switch says."""
    control = _cpu_seconds_of(tmp_path, the_cpu, 1.5, graded=False)
    if control[1]["cpu"] <= 0.6 * control[8]["cpu"]:
        pytest.skip("this machine's scheduler shares a CPU by thread, not by session (a "
                    f"plain 1-thread process got {control[1]['cpu']:.2f} s beside an "
                    f"8-thread one's {control[8]['cpu']:.2f} s): beyond one job per CPU "
                    "only the affinity applies (see CpuShares)")
    return the_cpu


def test_beyond_one_job_per_cpu_jobs_share_a_cpu_equally_whatever_their_threads(
        tmp_path, sessions_weighed):
    """Two jobs on one CPU, one of 8 busy threads, one of 1: each gets about half (by
    thread it would be 8/9 and 1/9). Other load on the machine slows both alike."""
    made = _cpu_seconds_of(tmp_path, sessions_weighed, 3.0, graded=True)
    one, eight = made[1], made[8]
    with open("/proc/self/autogroup") as handle:
        ours = handle.read().partition(" ")[0]
    assert one["group"] and eight["group"]  # each job started a session of its own
    assert len({one["group"], eight["group"], ours}) == 3  # a scheduling group each
    assert one["cpu"] > 0.6 * eight["cpu"], (one["cpu"], eight["cpu"])  # by thread: 1/8
