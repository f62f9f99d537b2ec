"""The PrairieLearn external grader (``moco-ref prairielearn build|test|run``) and the schema
of PrairieLearn's results.

Two submissions are graded for real through the entrypoint (each in the sandbox, ~5–10 s):
the correct lab and the one without the same-source mask. The rest grades nothing (a
submission with no Python file, stub entrypoints) or checks the schema directly."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from moco_ref import __version__
from moco_ref.cli.main import main
from moco_ref.judge.rubric import DEFAULT_RUBRIC, load_rubric
from moco_ref.platforms.course import CONFIG_NAME, SECRET_NAME
from moco_ref.platforms.prairielearn.packager import ENTRYPOINT, PL_MAX_TIMEOUT
from moco_ref.platforms.prairielearn.writer import SCHEMA_PATH, prairielearn_problems
from moco_ref.probe.options import GradeOptions
from moco_ref.tools.run_needs import RUN_NEEDS

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "submissions"
WHEEL = f"moco_ref-{__version__}-py3-none-any.whl"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """One package built from this checkout (its wheel included)."""
    outdir = tmp_path_factory.mktemp("pl") / "package"
    assert main(["prairielearn", "build", str(outdir), "--image", "course/moco-grader:1"]) == 0
    return outdir


def _tested(capsys, package: Path, *submissions, keep: Path, extra=()) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main(["prairielearn", "test", str(package), *map(str, submissions),
                 "--keep", str(keep), *extra])
    out = capsys.readouterr().out
    data = json.loads((keep / "results" / "results.json").read_text())
    return code, data, out


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("moco-ref: error: ") and err.count("\n") == 1, err
    return err


def _stub_package(tmp_path: Path, script: str) -> Path:
    """A package whose entrypoint is ``script`` (a shell script), for the test command."""
    tests = tmp_path / "stub" / "question" / "tests"
    tests.mkdir(parents=True)
    (tmp_path / "stub" / "question" / "info.json").write_text(
        json.dumps({"externalGradingOptions": {"timeout": 30}}))
    (tests / "run.sh").write_text("#!/usr/bin/env bash\n" + script)
    return tmp_path / "stub"


def _valid_results() -> dict:
    return {"gradable": True, "score": 0.5, "message": "graded", "output": "",
            "tests": [{"name": "I1: a", "description": "family I1", "points": 1,
                       "max_points": 2, "message": "failed: x", "output": "",
                       "images": [{"label": "loss", "url": "data:image/png;base64,AAAA"}]}]}


# --------------------------------------------------------------------------- build


def test_build_writes_the_image_the_question_and_its_tests(package):
    info = json.loads((package / "question" / "info.json").read_text())
    grading = info["externalGradingOptions"]
    assert grading["enabled"] is True and grading["image"] == "course/moco-grader:1"
    assert grading["entrypoint"] == ENTRYPOINT == "/grade/tests/run.sh"
    assert GradeOptions.timeout + RUN_NEEDS.seconds < grading["timeout"] <= PL_MAX_TIMEOUT
    assert info["gradingMethod"] == "External" and info["type"] == "v3" and info["uuid"]
    dockerfile = (package / "image" / "Dockerfile").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in dockerfile
    assert "torch==" in dockerfile and "torchvision==" in dockerfile
    assert "-slim" in dockerfile.split("FROM ", 1)[1].splitlines()[0]
    assert f"COPY {WHEEL} " in dockerfile and (package / "image" / WHEEL).is_file()
    assert "measured on 2" in dockerfile and f"{RUN_NEEDS.peak_mb} MB" in dockerfile
    run = package / "question" / "tests" / "run.sh"
    assert run.read_text().startswith("#!/usr/bin/env bash\n")
    assert run.stat().st_mode & stat.S_IXUSR
    assert "MOCO_REF_GRADE_ROOT:-/grade" in run.read_text() and "prairielearn run" in \
        run.read_text()
    rubric = load_rubric(package / "question" / "tests" / "rubric.toml")
    assert rubric.points("lab") == DEFAULT_RUBRIC.points("lab")
    config = json.loads((package / "question" / "tests" / CONFIG_NAME).read_text())
    assert config["job_timeout"] == grading["timeout"] and config["needs"]["seconds"] > 0
    assert 'file-names="moco.py"' in (package / "question" / "question.html").read_text()
    assert "measured on 2 cores" in (package / "README.md").read_text()


def test_a_rebuild_keeps_the_question_and_states_what_a_run_needs(package, tmp_path, capsys):
    outdir = tmp_path / "again"
    rubric = tmp_path / "course.toml"
    rubric.write_text("total = 40\n")
    first = ["prairielearn", "build", str(outdir), "--wheel", str(package / "image" / WHEEL)]
    assert main(first) == 0
    uuid = json.loads((outdir / "question" / "info.json").read_text())["uuid"]
    made = (outdir / "question" / "tests" / SECRET_NAME).read_text()
    capsys.readouterr()
    assert main([*first, "--rubric", str(rubric), "--timeout", "120", "--style", "lab",
                 "--file-name", "lab.py"]) == 0
    out = capsys.readouterr().out
    assert "measured on 2 cores" in out and f"{RUN_NEEDS.peak_mb} MB" in out
    info = json.loads((outdir / "question" / "info.json").read_text())
    assert info["uuid"] == uuid and info["externalGradingOptions"]["timeout"] > 120
    assert (outdir / "question" / "tests" / "rubric.toml").read_text() == "total = 40\n"
    secret = outdir / "question" / "tests" / SECRET_NAME  # made once, kept by the rebuild
    assert len(secret.read_text().strip()) == 64 and secret.stat().st_mode & 0o077 == 0
    assert secret.read_text() == made
    config = json.loads((outdir / "question" / "tests" / CONFIG_NAME).read_text())
    assert (config["style"], config["timeout"]) == ("lab", 120)
    assert sorted(p.name for p in (outdir / "image").glob("*.whl")) == [WHEEL]


def test_build_refuses_bad_input_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("total = -1\n")
    a_file = tmp_path / "file"
    a_file.write_text("")
    out = tmp_path / "out"
    for args, said in (
        (["--rubric", str(bad)], "--rubric:"),
        (["--timeout", "590"], "600 s"),
        (["--timeout", "0"], "--timeout"),
        (["--image", "Not An Image"], "--image"),
        (["--file-name", "../x.py"], "--file-name"),
        (["--wheel", str(bad)], "not a moco_ref wheel"),
    ):
        assert main(["prairielearn", "build", str(out), *args]) == 2, args
        assert said in _one_error_line(capsys)
    assert main(["prairielearn", "build", str(a_file)]) == 2
    assert "is a file" in _one_error_line(capsys)
    assert not out.exists()


# --------------------------------------------------------------------------- test: grading


def test_the_correct_lab_scores_1_and_is_gradable(package, capsys, tmp_path):
    keep = tmp_path / "grade"
    code, data, out = _tested(capsys, package, EXAMPLES / "correct_lab_order.py", keep=keep)
    assert code == 0 and "results.json: valid" in out, out
    assert data["gradable"] is True and data["score"] == 1.0
    assert data["tests"] and all(t["points"] == t["max_points"] for t in data["tests"])
    assert sum(t["max_points"] for t in data["tests"]) == pytest.approx(100, abs=1e-2)
    assert prairielearn_problems(data) == []
    handed_in = json.loads((keep / "data" / "data.json").read_text())
    assert [f["name"] for f in handed_in["submitted_answers"]["_files"]] == [
        "correct_lab_order.py"]
    assert (keep / "student" / "correct_lab_order.py").is_file()
    assert (keep / "tests" / "rubric.toml").is_file()
    text = json.dumps(data)
    assert str(tmp_path) not in text and str(EXAMPLES) not in text


def test_the_missing_mask_scores_below_1_with_its_figures(package, capsys, tmp_path):
    code, data, out = _tested(capsys, package, EXAMPLES / "bug_no_mask.py",
                              keep=tmp_path / "grade")
    assert code == 0 and "results.json: valid" in out, out
    assert data["gradable"] is True and 0 <= data["score"] < 1
    tests = {t["name"].split(":")[0]: t for t in data["tests"]}
    mask = tests["I4-same-source-masked"]
    assert mask["points"] == 0 and mask["max_points"] > 0
    assert mask["message"].startswith("failed")
    for image in mask.get("images", []):  # drawn where matplotlib is installed
        assert image["url"].startswith("data:image/png;base64,") and image["label"]
    assert all("images" not in t for t in data["tests"] if t["points"] == t["max_points"])


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the default-container simulation starts as root")
def test_the_correct_lab_scores_1_in_the_simulated_default_container(package, capsys,
                                                                      tmp_path):
    code, data, out = _tested(capsys, package, EXAMPLES / "correct_lab_order.py",
                              keep=tmp_path / "grade", extra=["--default-container"])
    assert code == 0 and "results.json: valid" in out, out
    assert data["gradable"] is True and data["score"] == 1.0


def test_a_submission_without_python_is_not_gradable_with_format_errors(package, capsys,
                                                                          tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my answer is in my head\n")
    code, data, out = _tested(capsys, package, notes, keep=tmp_path / "grade")
    assert code == 0 and "results.json: valid" in out
    assert data["gradable"] is False and data["tests"] == [] and data["score"] == 0
    assert data["format_errors"] and "no .py file" in data["format_errors"][0]
    assert "format_errors" in out


# --------------------------------------------------------------------------- the schema


def test_the_schema_accepts_the_documented_shapes():
    assert prairielearn_problems(_valid_results()) == []
    assert prairielearn_problems({"gradable": False, "score": 0, "message": "m", "output": "",
                                  "format_errors": "one line", "tests": []}) == []
    strings = _valid_results()
    strings["images"] = ["data:image/jpeg;base64,AAAA"]
    assert prairielearn_problems(strings) == []
    assert _schema()["properties"]["score"] == {"type": "number", "minimum": 0,
                                                            "maximum": 1}


@pytest.mark.parametrize("break_it, where", [
    (lambda d: d.update(score=1.5), "score"),
    (lambda d: d.update(score=-0.1), "score"),
    (lambda d: d.update(gradable="yes"), "gradable"),
    (lambda d: d.update(gradable=False), "format_errors"),
    (lambda d: d.update(gradable=False, format_errors=[]), "format_errors"),
    (lambda d: d.pop("tests"), "tests"),
    (lambda d: d["tests"][0].pop("name"), "name"),
    (lambda d: d["tests"][0].pop("max_points"), "max_points"),
    (lambda d: d["tests"][0].update(points="1"), "tests/0/points"),
    (lambda d: d["tests"][0].update(points=3), "above max_points"),
    (lambda d: d["tests"][0].update(status="passed"), "status"),
    (lambda d: d["tests"][0]["images"][0].update(url="http://x/a.png"), "images/0"),
    (lambda d: d.update(output="x" * 1_100_000), "byte limit"),
])
def test_the_schema_rejects_broken_results(break_it, where):
    data = _valid_results()
    break_it(data)
    problems = prairielearn_problems(data)
    assert problems and any(where in problem for problem in problems), problems


def test_prairielearn_test_exits_1_on_invalid_results(tmp_path, capsys):
    stub = _stub_package(tmp_path, 'mkdir -p "$MOCO_REF_GRADE_ROOT/results"\n'
                         'echo \'{"gradable": true, "score": 2, "tests": [{"points": 1}]}\' '
                         '> "$MOCO_REF_GRADE_ROOT/results/results.json"\n')
    submission = tmp_path / "s.py"
    submission.write_text("")
    assert main(["prairielearn", "test", str(stub), str(submission)]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "score" in out and "name" in out
    quiet = _stub_package(tmp_path / "q", "exit 3\n")
    assert main(["prairielearn", "test", str(quiet), str(submission)]) == 1
    out = capsys.readouterr().out
    assert "wrote no results/results.json" in out and "exited with 3" in out


def test_prairielearn_test_passes_the_isolation_to_the_entrypoint(tmp_path, capsys):
    stub = _stub_package(tmp_path, 'mkdir -p "$MOCO_REF_GRADE_ROOT/results"\n'
                         'printf \'{"gradable": true, "score": 1, "message": "%s", '
                         '"output": "", "tests": []}\' "$MOCO_REF_ISOLATION" '
                         '> "$MOCO_REF_GRADE_ROOT/results/results.json"\n')
    submission = tmp_path / "s.py"
    submission.write_text("")
    keep = tmp_path / "grade"
    code, data, _ = _tested(capsys, stub, submission, keep=keep,
                            extra=["--isolation", "processes"])
    assert code == 0 and data["message"] == "processes"


def test_prairielearn_test_refuses_bad_input_in_one_line(package, tmp_path, capsys):
    submission = tmp_path / "s.py"
    submission.write_text("")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "s.py").write_text("")
    for args, said in (
        ([str(tmp_path / "missing"), str(submission)], "no such folder"),
        ([str(tmp_path), str(submission)], "not a package"),
        ([str(package), str(tmp_path / "missing.py")], "no such file"),
        ([str(package), str(submission), "--timeout", "0"], "--timeout"),
        ([str(package), str(submission), "--keep", str(tmp_path / "full")], "not an empty"),
        ([str(package), str(submission), str(tmp_path / "other")], "both be student/s.py"),
    ):
        assert main(["prairielearn", "test", *args]) == 2, args
        assert said in _one_error_line(capsys)


# --------------------------------------------------------------------------- run


def test_prairielearn_run_always_writes_results(package, tmp_path, capsys, monkeypatch):
    root = tmp_path / "grade"
    (root / "student").mkdir(parents=True)
    monkeypatch.setenv("MOCO_REF_GRADE_ROOT", str(root))
    assert main(["prairielearn", "run"]) == 0  # no student file: nothing to grade
    data = json.loads((root / "results" / "results.json").read_text())
    assert prairielearn_problems(data) == [] and data["gradable"] is False
    assert "not gradable" in capsys.readouterr().out
    (root / "tests").mkdir()
    (root / "tests" / "rubric.toml").write_text("total = 0\n")  # edited after the build
    assert main(["prairielearn", "run", "--root", str(root)]) == 2
    assert "the grader's rubric" in capsys.readouterr().err
    data = json.loads((root / "results" / "results.json").read_text())
    assert prairielearn_problems(data) == [] and "course staff" in data["message"]
    assert os.environ["MOCO_REF_GRADE_ROOT"] == str(root)


def _schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
