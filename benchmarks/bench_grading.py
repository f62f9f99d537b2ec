"""The grader: wall time per submission (interpreter start included), per check family, and
throughput with -j 1 against -j 2."""

import shutil
from pathlib import Path

import pytest

from moco_ref.judge.judge import judge
from moco_ref.judge.registry import all_checks
from moco_ref.observe.loader import load_submission
from moco_ref.observe.observers import observe
from moco_ref.probe.options import GradeOptions
from moco_ref.run.pipeline import grade_many, grade_submission

ROOT = Path(__file__).resolve().parents[1]
CORRECT = ROOT / "examples" / "submissions" / "correct_lab_order.py"
FAMILIES = sorted({spec.family for spec in all_checks("lab")})


def test_grade_one_submission(benchmark):
    benchmark.group = "grading: one submission, end to end"
    report = benchmark.pedantic(grade_submission, args=(str(CORRECT), GradeOptions()),
                                rounds=3, iterations=1)
    assert report.gradable and report.score == report.max_score


@pytest.fixture(scope="module")
def observations():
    namespace = load_submission(str(CORRECT)).namespace
    return observe(namespace, "lab", GradeOptions())


@pytest.mark.parametrize("family", FAMILIES)
def test_judge_family(benchmark, observations, family):
    benchmark.group = "grading: judge one check family (observations recorded)"
    ids = tuple(spec.check_id for spec in all_checks("lab") if spec.family == family)
    results, _ = benchmark(judge, observations, "lab", GradeOptions(checks=ids))
    assert results and all(r.status.value == "passed" for r in results)


def _copies(folder: Path, count: int) -> list[str]:
    """``count`` copies of the correct submission, each a file of its own."""
    targets = []
    for i in range(count):
        target = folder / f"submission_{i}.py"
        shutil.copy(CORRECT, target)
        targets.append(str(target))
    return targets


@pytest.mark.parametrize("jobs", [1, 2])
def test_throughput(benchmark, tmp_path, jobs):
    benchmark.group = "grading: 4 submissions, -j 1 against -j 2"
    targets = _copies(tmp_path, 4)
    reports = benchmark.pedantic(grade_many, args=(targets, GradeOptions()),
                                 kwargs={"jobs": jobs}, rounds=1, iterations=1)
    assert all(r.score == r.max_score for r in reports)


@pytest.mark.parametrize("isolation", ["bwrap", "processes"])
def test_throughput_by_isolation(benchmark, tmp_path, monkeypatch, isolation):
    """The bubblewrap sandbox's cost per submission against processes alone (the warm
    process of each is started before timing)."""
    from moco_ref.sandbox import client

    benchmark.group = "grading: 8 submissions -j 2, bwrap against processes"
    monkeypatch.setenv(client.ISOLATION_VARIABLE, isolation)
    client.current_zygote()
    targets = _copies(tmp_path, 8)
    reports = benchmark.pedantic(grade_many, args=(targets, GradeOptions()),
                                 kwargs={"jobs": 2}, rounds=2, iterations=1)
    assert all(r.score == r.max_score for r in reports)
    assert all(r.isolation.startswith(isolation) for r in reports)
