"""The pytest plugin, run in-process by pytester: one test per check, ids are check ids, -k
selects, verdicts are reported as they are (never "passed" for a check that did not run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

# Imported here, before pytester snapshots sys.modules: torch cannot be imported twice.
import moco_ref.cli.pytest_plugin  # noqa: F401, E402
import moco_ref.run.pipeline  # noqa: F401, E402
from tests.helpers.grading_stubs.fixtures import BAD_FIFO_WARMUP, stubbed, write  # noqa: F401 - fixture

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "moco_ref.cli.pytest_plugin"


@pytest.fixture
def run_pytest(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # exactly this plugin, once

    def run(*arguments: str):
        return pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider", *arguments)

    return run


def test_plugin_is_registered_as_a_pytest11_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"]["moco_ref"] == PLUGIN


@pytest.mark.usefixtures("stubbed")
def test_one_test_per_check_selected_with_k(pytester, run_pytest):
    write(pytester.path, "student_moco.py", BAD_FIFO_WARMUP)
    result = run_pytest("--moco-impl=student_moco.py", "-k", "not W2", "-v", "-rs")
    result.assert_outcomes(failed=1, skipped=1, deselected=1)
    result.stdout.fnmatch_lines([
        "*collected 3 items / 1 deselected / 2 selected*",
        "student_moco.py::W1-warmup-fifo FAILED*",  # a node id that runs again as printed
        "student_moco.py::B1-builder-only SKIPPED*",
        "*queue kept the oldest*",
        "rerun: moco-ref grade */student_moco.py --check W1-warmup-fifo",
        "*student_moco.py — style lab — score 0/1*",  # -k: W2 was not graded at all
        "SKIPPED ?1? student_moco.py*: B1-builder-only: does not apply to style lab",
    ])
    assert "W2-warmup-ema" not in result.stdout.str()


def test_without_moco_impl_the_plugin_does_nothing(pytester, run_pytest):
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = run_pytest("-q")
    result.assert_outcomes(passed=1)
    assert "moco-ref" not in result.stdout.str()


@pytest.mark.usefixtures("stubbed")
def test_a_bad_moco_impl_is_a_usage_error(pytester, run_pytest):
    result = run_pytest("--moco-impl=no_such_file.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--moco-impl: no such file*"])


@pytest.mark.usefixtures("stubbed")
def test_collect_only_lists_the_checks_without_grading(pytester, run_pytest, monkeypatch):
    from moco_ref.run import pipeline as grading

    def refuse(*args, **kwargs):
        raise AssertionError("--collect-only graded the implementation")

    monkeypatch.setattr(grading, "grade_submission", refuse)
    write(pytester.path, "student_moco.py", BAD_FIFO_WARMUP)
    result = run_pytest("--moco-impl=student_moco.py", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*W1-warmup-fifo*", "*3 tests collected*"])


@pytest.mark.usefixtures("stubbed")
def test_families_are_markers_and_junit_has_points(pytester, run_pytest):
    write(pytester.path, "student_moco.py", BAD_FIFO_WARMUP)
    junit = pytester.path / "junit.xml"
    result = run_pytest("--moco-impl=student_moco.py", "-m", "warmup", f"--junitxml={junit}",
                        "--moco-write=gradescope=out/results.json",
                        "--moco-write=json=out/report.json")
    result.assert_outcomes(failed=1, passed=1, deselected=1)  # W1 and W2 are warmup checks
    xml = junit.read_text()
    assert 'name="points"' in xml and 'name="submission" value="student_moco.py"' in xml
    # the plugin takes writers as grade does: the student's results, from the same grading
    results = json.loads((pytester.path / "out" / "results.json").read_text())
    status = {test["name"].split(":")[0]: test["status"] for test in results["tests"]}
    assert status["W1-warmup-fifo"] == "failed" and status["W2-warmup-ema"] == "passed"
    report = json.loads((pytester.path / "out" / "report.json").read_text())["reports"][0]
    assert report["submission"].endswith("student_moco.py")


def test_an_unknown_writer_is_a_usage_error(pytester, run_pytest):
    write(pytester.path, "student_moco.py", BAD_FIFO_WARMUP)
    result = run_pytest("--moco-impl=student_moco.py", "--moco-write=nope=x.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--moco-write nope=x.json" in result.stderr.str()


def test_under_xdist_the_implementation_is_graded_once(monkeypatch, tmp_path):
    """Every xdist worker collects the same items: the first grades, the others read its
    report (per test run)."""
    import tempfile
    from types import SimpleNamespace

    from moco_ref.cli import pytest_plugin
    from moco_ref.judge.results import SubmissionReport
    from moco_ref.probe.options import GradeOptions
    from moco_ref.run import pipeline as grading

    calls = []

    def fake(target, options=None, isolation=None):
        calls.append(target)
        return SubmissionReport(target, "lab", gradable=True, notes=["graded"])

    monkeypatch.setattr(grading, "grade_submission", fake)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    workers = [SimpleNamespace(workerinput={"workerid": f"gw{i}", "testrunuid": "run-1"})
               for i in range(3)]
    reports = [pytest_plugin._graded_once(w, "student.py", GradeOptions()) for w in workers]
    assert calls == ["student.py"] and all(r.notes == ["graded"] for r in reports)
    another_run = SimpleNamespace(workerinput={"workerid": "gw0", "testrunuid": "run-2"})
    pytest_plugin._graded_once(another_run, "student.py", GradeOptions())
    assert len(calls) == 2
