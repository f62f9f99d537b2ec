"""``moco-ref grade`` and ``moco-ref demo``: exit codes 0 / 1 / 2, outputs, and two runs end
to end through real child processes (with the stand-in harness)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import moco_ref
from moco_ref.cli import main
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.run import pipeline as grading
from moco_ref.run.demo import DemoOutcome, Example, manifest_candidates
from tests.helpers.grading_stubs.fixtures import (  # noqa: F401 - fixtures
    BAD_FIFO_WARMUP,
    GOOD_WARMUP,
    stubbed,
    write,
)


def _report(target: str, earned: float, gradable: bool = True) -> SubmissionReport:
    results = [
        CheckResult("W1-warmup-fifo", "fifo", "warmup", 1, Status.PASSED),
        CheckResult("W2-warmup-ema", "ema", "warmup", 2,
                    Status.PASSED if earned == 3 else Status.FAILED, "EMA wrong"),
    ]
    return SubmissionReport(target, "lab", gradable, results if gradable else [],
                            traceback="" if gradable else "ImportError: x")


@pytest.fixture
def fake_grading(monkeypatch):
    """Reports without child processes: a file named ``full*`` earns 3/3, ``half*`` 1/3,
    ``broken*`` is not gradable."""

    def grade_many(targets, options=None, *, jobs=1, on_report=None, isolation=None):
        reports = []
        for target in targets:
            name = target.rsplit("/", 1)[-1]
            reports.append(_report(target, 3 if name.startswith("full") else 1,
                                   gradable=not name.startswith("broken")))
        return reports

    monkeypatch.setattr(grading, "grade_many", grade_many)


@pytest.fixture
def files(tmp_path):
    return {name: write(tmp_path, f"{name}.py", "") for name in ("full", "half", "broken")}


@pytest.mark.usefixtures("fake_grading")
@pytest.mark.parametrize(
    ("names", "extra", "code"),
    [
        (["full"], [], 0),
        (["full", "half"], [], 1),
        (["full", "half"], ["--min-score", "1"], 0),
        (["half"], ["--min-score", "34%"], 1),
        (["half"], ["--min-score", "33%"], 0),
        (["broken"], ["--min-score", "0"], 1),
    ],
)
def test_exit_code_follows_min_score(files, names, extra, code, capsys):
    assert main(["grade", *(files[n] for n in names), *extra]) == code
    out = capsys.readouterr().out
    assert ("reach" if code == 0 else "below") in out.splitlines()[-1]


@pytest.mark.usefixtures("fake_grading", "stubbed")
@pytest.mark.parametrize(
    "arguments",
    [
        ["grade", "no/such/file.py"],
        ["grade", "{full}", "{half}", "--gradescope", "out.json"],
        ["grade", "{full}", "--min-score", "lots"],
        ["grade", "{full}", "--check", "no-such-check"],
        ["grade", "{full}", "--timeout", "0"],
        ["demo", "--manifest", "no/such/manifest.json"],
    ],
)
def test_usage_errors_exit_2(files, arguments, capsys):
    assert main([argument.format(**files) for argument in arguments]) == 2
    assert "moco-ref: error:" in capsys.readouterr().err


@pytest.mark.usefixtures("fake_grading", "stubbed")
@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--min-score", "nan"], "--min-score"),
        (["--min-score", "inf"], "--min-score"),
        (["--min-score", ""], "--min-score"),
        (["-j", "0"], "--jobs"),
        (["--timeout", "0"], "--timeout"),
        (["--timeout", "nan"], "--timeout"),
        (["--check-timeout", "-1"], "--check-timeout"),
        (["--out", "{afile}"], "--out"),
    ],
)
def test_each_bad_option_is_named_in_one_line(files, tmp_path, arguments, named, capsys):
    afile = tmp_path / "a-file"
    afile.write_text("")
    code = main(["grade", files["full"],
                 *(a.format(afile=afile) for a in arguments)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and named in err[0] and "Traceback" not in err[0]


def test_record_of_a_missing_path_exits_2_like_grade(tmp_path, capsys):
    assert main(["record", str(tmp_path / "nowhere.py"), "--out", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err.startswith("moco-ref: error:")


def test_argparse_errors_exit_2(files):
    with pytest.raises(SystemExit) as caught:
        main(["grade", files["full"], "--style", "nonsense"])
    assert caught.value.code == 2


@pytest.mark.usefixtures("fake_grading")
def test_json_goes_to_stdout_alone(files, capsys):
    assert main(["grade", files["full"], files["half"], "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False and data["min_score"] == "full marks"
    assert [report["score"] for report in data["reports"]] == [3, 1]


@pytest.mark.usefixtures("stubbed")
def test_grade_end_to_end_writes_junit_and_gradescope(tmp_path, capsys):
    submission = write(tmp_path, "alice.py", BAD_FIFO_WARMUP)
    junit, gradescope = tmp_path / "junit.xml", tmp_path / "results.json"
    code = main(["grade", submission, "--junit", str(junit), "--gradescope", str(gradescope),
                 "--seed", "3"])
    assert code == 1
    out = capsys.readouterr().out
    assert "score 2/3" in out and "queue kept the oldest" in out
    pasted = out.replace(" \\\n    ", " ")  # a rerun longer than 80 columns: continuations
    assert f"moco-ref grade {submission} --check W1-warmup-fifo --seed 3" in pasted
    assert ET.parse(junit).getroot().get("failures") == "1"
    results = json.loads(gradescope.read_text())
    assert results["score"] == 2 and len(results["tests"]) == 2


@pytest.mark.usefixtures("stubbed")
def test_demo_compares_verdicts_with_the_manifest(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # piped, the table is 80 wide: a bug on one line
    folder = tmp_path / "submissions"
    folder.mkdir()
    write(folder, "correct.py", GOOD_WARMUP)
    write(folder, "fifo_oldest.py", BAD_FIFO_WARMUP)
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"submissions": [
        {"path": "correct.py", "style": "lab", "expect_full_marks": True,
         "expected_failed_families": []},
        {"path": "fifo_oldest.py", "style": "lab", "expect_full_marks": False,
         "expected_failed_families": ["warmup"], "bug": "queue keeps the oldest"},
    ]}))
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--manifest", str(manifest), "-j", "2", "--write", "junit"]) == 0
    out = capsys.readouterr().out
    assert "2/2 verdicts as expected" in out.splitlines()[-1]
    assert "✓ fifo_oldest.py" in out and "fails warmup → fails warmup (2/3)" in out
    board = tmp_path / "moco-ref-demo" / "scoreboard.txt"
    assert str(board.relative_to(tmp_path)) in out.splitlines()[-1]
    assert "queue keeps the oldest" in board.read_text(encoding="utf-8")
    junit = (tmp_path / "moco-ref-demo" / "fifo_oldest.junit.xml").read_text(encoding="utf-8")
    assert 'failures="1"' in junit and "W1-warmup-fifo" in junit  # the demo takes writers
    assert (tmp_path / "moco-ref-demo" / "correct.junit.xml").is_file()


def test_demo_verdicts():
    def outcome(expect_full, families, earned, gradable=True):
        example = Example(Path("x.py"), "lab", expect_full, families)
        return DemoOutcome(example, _report("x.py", earned, gradable))

    assert outcome(True, (), 3).as_expected
    assert not outcome(True, (), 1).as_expected
    assert outcome(False, ("warmup",), 1).as_expected
    assert not outcome(False, ("I3",), 1).as_expected  # fails, but not what the bug breaks
    assert not outcome(False, ("warmup",), 3).as_expected  # bug not caught
    assert not outcome(False, ("warmup",), 1, gradable=False).as_expected


def test_demo_looks_in_the_package_then_the_repository():
    package = moco_ref.__file__.rsplit("/", 1)[0]
    inside, beside = manifest_candidates()[:2]
    assert str(inside) == f"{package}/examples/submissions/manifest.json"
    assert str(beside) == f"{package.rsplit('/', 1)[0]}/examples/submissions/manifest.json"
