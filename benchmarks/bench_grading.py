"""The grader: wall time per submission (interpreter start included), per check family, and
throughput with -j 1 against -j 2."""

import shutil
from pathlib import Path

import pytest

from moco_ref.grade import grade_many, grade_submission
from moco_ref.judge.judge import judge
from moco_ref.judge.registry import all_checks
from moco_ref.observe.loader import load_submission
from moco_ref.observe.observers import observe
from moco_ref.observe.options import GradeOptions

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


@pytest.mark.parametrize("jobs", [1, 2])
def test_throughput(benchmark, tmp_path, jobs):
    benchmark.group = "grading: 4 submissions, -j 1 against -j 2"
    targets = []
    for i in range(4):
        target = tmp_path / f"submission_{i}.py"
        shutil.copy(CORRECT, target)
        targets.append(str(target))
    reports = benchmark.pedantic(grade_many, args=(targets, GradeOptions()),
                                 kwargs={"jobs": jobs}, rounds=1, iterations=1)
    assert all(r.score == r.max_score for r in reports)
