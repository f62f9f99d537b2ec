"""The Gradescope autograder (``moco-ref gradescope build|test|run``), its student-safe
results and their schema, and PrairieLearn's results.

Three submissions are graded for real (each in the sandbox, ~5–10 s): the correct lab, the
one without the same-source mask, and an empty file."""

from __future__ import annotations

import json
import re
import stat
import zipfile
from pathlib import Path

import nbformat
import pytest

from moco_ref import __version__
from moco_ref.cli.main import main
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC, Rubric, load_rubric
from moco_ref.platforms.course import (
    CONFIG_NAME,
    SECRET_NAME,
    NoSubmission,
    find_submission,
    rubric_toml,
)
from moco_ref.platforms.gradescope.packager import grade_in_autograder
from moco_ref.platforms.gradescope.writer import gradescope_problems, gradescope_results
from moco_ref.platforms.prairielearn.writer import WRITER as PRAIRIELEARN
from moco_ref.platforms.prairielearn.writer import prairielearn_results
from moco_ref.probe.options import GradeOptions
from moco_ref.report.text import student_text
from moco_ref.report.writers import Writing
from moco_ref.tools.run_needs import RUN_NEEDS

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "submissions"
CUSTOM_RUBRIC = """\
total = 50
[visibility]
I4 = "hidden"
I8 = "after_due_date"
"""
# An absolute path of two components or more, as a grader path would show.
_ABSOLUTE = re.compile(r"(?<![\w.])/[\w.-]+/[\w.-]+")


def _members(path: Path) -> dict[str, zipfile.ZipInfo]:
    with zipfile.ZipFile(path) as archive:
        return {info.filename: info for info in archive.infolist()}


def _read(path: Path, member: str) -> str:
    with zipfile.ZipFile(path) as archive:
        return archive.read(member).decode("utf-8")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The default zip (its wheel built from this checkout) and a zip with the custom
    rubric (reusing that wheel)."""
    folder = tmp_path_factory.mktemp("autograders")
    default = folder / "autograder.zip"
    assert main(["gradescope", "build", "--out", str(default)]) == 0
    wheel = next(name for name in _members(default) if name.endswith(".whl"))
    with zipfile.ZipFile(default) as archive:
        archive.extract(wheel, folder)
    rubric = folder / "course.toml"
    rubric.write_text(CUSTOM_RUBRIC)
    custom = folder / "custom.zip"
    assert main(["gradescope", "build", "--out", str(custom), "--rubric", str(rubric),
                 "--style", "lab", "--timeout", "90", "--wheel", str(folder / wheel)]) == 0
    return {"default": default, "custom": custom, "folder": folder}


def _tried(built, capsys, zip_name: str, submission, keep: Path) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main(["gradescope", "test", str(built[zip_name]), str(submission),
                 "--keep", str(keep)])
    out = capsys.readouterr().out
    data = json.loads((keep / "results" / "results.json").read_text())
    return code, data, out


# --------------------------------------------------------------------------- build


def test_the_zip_holds_the_scripts_the_rubric_and_this_version(built):
    members = _members(built["default"])
    wheel = f"wheels/moco_ref-{__version__}-py3-none-any.whl"
    assert set(members) == {"setup.sh", "run_autograder", "rubric.toml", CONFIG_NAME, wheel,
                            SECRET_NAME}
    # a course secret made at build time: 64 hex digits, a new one per build
    secret = _read(built["default"], SECRET_NAME).strip()
    assert len(secret) == 64 and int(secret, 16) >= 0
    assert secret != _read(built["custom"], SECRET_NAME).strip()
    assert secret not in _read(built["default"], "run_autograder")  # never on a command line
    for script in ("setup.sh", "run_autograder"):
        assert (members[script].external_attr >> 16) & stat.S_IXUSR
        assert _read(built["default"], script).startswith("#!/usr/bin/env bash\n")
    setup = _read(built["default"], "setup.sh")
    assert "download.pytorch.org/whl/cpu" in setup and "torch==" in setup
    assert f'pip install "$SOURCE/{wheel}"' in setup
    run = _read(built["default"], "run_autograder")
    assert "MOCO_REF_AUTOGRADER_ROOT:-/autograder" in run and "gradescope run" in run
    with zipfile.ZipFile(built["default"]) as archive, archive.open(wheel) as handle:
        inner = zipfile.ZipFile(handle).namelist()
    assert {"moco_ref/platforms/gradescope/results.schema.json",
            "moco_ref/platforms/prairielearn/results.schema.json"} <= set(inner)
    config = json.loads(_read(built["default"], CONFIG_NAME))
    assert config["moco_ref_version"] == __version__ and config["style"] is None
    rubric = built["folder"] / "default.toml"
    rubric.write_text(_read(built["default"], "rubric.toml"))
    assert load_rubric(rubric).points("lab") == DEFAULT_RUBRIC.points("lab")


def test_a_custom_rubric_style_and_timeout_travel_in_the_zip(built):
    assert _read(built["custom"], "rubric.toml") == CUSTOM_RUBRIC
    config = json.loads(_read(built["custom"], CONFIG_NAME))
    assert (config["style"], config["timeout"]) == ("lab", 90)


def test_the_default_rubric_written_out_reads_back_the_same(tmp_path):
    rubric = Rubric(total=40, families={"I4": 2}, checks={"I3-fifo-keeps-newest": 3},
                    visibility={"I8": "hidden"}, show_submission_output=True)
    path = tmp_path / "r.toml"
    path.write_text(rubric_toml(rubric))
    again = load_rubric(path)
    assert again.points("lab") == rubric.points("lab")
    assert again.visibility_of("I8-key-from-other-view") == "hidden"
    assert again.show_submission_output


def test_build_refuses_bad_input_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("total = -1\n")
    assert main(["gradescope", "build", "--out", str(tmp_path / "a.zip"),
                 "--rubric", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moco-ref: error: --rubric:") and err.count("\n") == 1
    assert main(["gradescope", "build", "--out", str(tmp_path / "a.zip"),
                 "--wheel", str(bad)]) == 2
    assert "not a moco_ref wheel" in capsys.readouterr().err
    assert not (tmp_path / "a.zip").exists()


def test_the_build_states_the_memory_and_time_one_run_needs(built, tmp_path, capsys):
    wheel = next((built["folder"] / "wheels").glob("moco_ref-*.whl"))
    capsys.readouterr()
    out_zip = tmp_path / "a.zip"
    assert main(["gradescope", "build", "--out", str(out_zip), "--wheel", str(wheel)]) == 0
    out = capsys.readouterr().out
    assert f"about {RUN_NEEDS.peak_mb} MB" in out and f"about {RUN_NEEDS.seconds} s" in out
    assert "measured on 2 cores" in out and "768 MB" in out
    assert json.loads(_read(out_zip, CONFIG_NAME))["needs"] == RUN_NEEDS.as_dict()
    assert RUN_NEEDS.container_mb >= RUN_NEEDS.peak_mb


# --------------------------------------------------------------------------- gradescope test


def test_the_correct_lab_gets_full_marks(built, capsys, tmp_path):
    code, data, out = _tried(built, capsys, "default", EXAMPLES / "correct_lab_order.py",
                             tmp_path / "ag")
    assert code == 0 and "results.json: valid" in out
    assert data["score"] == pytest.approx(100, abs=1e-3)
    assert data["tests"] and all(test["status"] == "passed" for test in data["tests"])
    assert sum(test["max_score"] for test in data["tests"]) == pytest.approx(100, abs=1e-2)
    assert "`correct_lab_order.py`" in data["output"]


def test_the_missing_mask_fails_I4_with_the_rubrics_visibilities(built, capsys, tmp_path):
    root = tmp_path / "ag"
    code, data, out = _tried(built, capsys, "custom", EXAMPLES / "bug_no_mask.py", root)
    assert code == 0 and "results.json: valid" in out
    tests = {test["name"].split(":")[0]: test for test in data["tests"]}
    mask = tests["I4-same-source-masked"]
    assert (mask["status"], mask["score"], mask["visibility"]) == ("failed", 0, "hidden")
    assert mask["tags"] == ["I4", "failed"] and mask["number"] == "I4.1"
    assert "same-source negatives were not masked" in mask["output"]
    assert data["score"] < 50 and sum(t["max_score"] for t in tests.values()) == \
        pytest.approx(50, abs=1e-2)
    for check, test in tests.items():
        family = check.split("-", 1)[0]
        expected = {"I4": "hidden", "I8": "after_due_date"}.get(family, "visible")
        assert test["visibility"] == expected, check
        assert test["output_format"] == "md" and test["tags"][0] == family
    assert data["output_format"] == "md" and data["stdout_visibility"] == "hidden"
    text = json.dumps(data)
    assert "rerun" not in text.lower() and "moco-ref grade" not in text
    for forbidden in ("/work", "/opt/moco-ref", "/tmp", str(root), str(EXAMPLES)):
        assert forbidden not in text
    assert not _ABSOLUTE.findall(data["output"] + "".join(t["output"] for t in data["tests"]))


def test_an_empty_file_is_one_failed_test_and_score_zero(built, capsys, tmp_path):
    empty = tmp_path / "handin" / "empty.py"
    empty.parent.mkdir()
    empty.write_text("")
    code, data, out = _tried(built, capsys, "default", empty.parent, tmp_path / "ag")
    assert code == 0 and "results.json: valid" in out
    assert data["score"] == 0 and len(data["tests"]) == 1
    (test,) = data["tests"]
    assert test["status"] == "failed" and "empty" in test["output"]
    assert str(tmp_path) not in json.dumps(data)


def test_gradescope_test_exits_1_on_invalid_results_and_2_on_bad_input(tmp_path, capsys):
    broken = tmp_path / "broken.zip"
    with zipfile.ZipFile(broken, "w") as archive:
        archive.writestr("setup.sh", "#!/bin/sh\n")
        archive.writestr("run_autograder", '#!/bin/sh\necho \'{"score": 1, "tests": '
                         '[{"name": "x", "status": "ok"}]}\' '
                         '> "$MOCO_REF_AUTOGRADER_ROOT/results/results.json"\n')
    submission = tmp_path / "s.py"
    submission.write_text("")
    assert main(["gradescope", "test", str(broken), str(submission)]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "status" in out
    for zip_path, sub in ((tmp_path / "missing.zip", submission), (submission, submission),
                          (broken, tmp_path / "missing.py")):
        assert main(["gradescope", "test", str(zip_path), str(sub)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("moco-ref: error: ") and err.count("\n") == 1
    no_runner = tmp_path / "no_runner.zip"
    with zipfile.ZipFile(no_runner, "w") as archive:
        archive.writestr("setup.sh", "#!/bin/sh\n")
    assert main(["gradescope", "test", str(no_runner), str(submission)]) == 2
    assert "run_autograder" in capsys.readouterr().err


def test_gradescope_run_without_a_submission_still_writes_results(tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.setenv("MOCO_REF_AUTOGRADER_ROOT", str(tmp_path))
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "notes.txt").write_text("hi")
    assert main(["gradescope", "run"]) == 0
    data = json.loads((tmp_path / "results" / "results.json").read_text())
    assert gradescope_problems(data) == [] and data["score"] == 0
    assert "no .py file" in data["tests"][0]["output"]
    assert "not gradable" in capsys.readouterr().out
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "rubric.toml").write_text("total = 0\n")  # edited after the build
    assert main(["gradescope", "run"]) == 2
    assert "the autograder's rubric" in capsys.readouterr().err
    data = json.loads((tmp_path / "results" / "results.json").read_text())
    assert gradescope_problems(data) == [] and "course staff" in data["tests"][0]["output"]


def test_the_main_file_is_the_one_defining_the_entry_points(tmp_path):
    (tmp_path / "helpers.py").write_text("def train_helper():\n    pass\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "lab.py").write_text("def train_moco():\n    pass\n"
                                             "def moco_warmup():\n    pass\n")
    cell = nbformat.v4.new_code_cell("def train_moco():\n    pass")
    notebook = nbformat.v4.new_notebook(cells=[cell])
    nbformat.write(notebook, str(tmp_path / "notebook.ipynb"))
    assert find_submission(tmp_path) == tmp_path / "sub" / "lab.py"
    (tmp_path / "sub" / "lab.py").unlink()
    assert find_submission(tmp_path) == tmp_path / "notebook.ipynb"
    (tmp_path / "notebook.ipynb").unlink()
    assert find_submission(tmp_path) == tmp_path / "helpers.py"  # the only file
    (tmp_path / "more.py").write_text("x = 1\n")
    with pytest.raises(NoSubmission, match="helpers.py, more.py"):
        find_submission(tmp_path)
    assert grade_in_autograder  # the run itself is exercised through `gradescope test`


# --------------------------------------------------------------------------- results and schema


def _report(**overrides) -> SubmissionReport:
    fields = dict(
        submission="/work/class/alice/lab.py",
        style="lab",
        gradable=True,
        results=[
            CheckResult("I1-key-grads-none", "key grads stay None", "I1", 2, Status.PASSED),
            CheckResult("I3-fifo-keeps-newest", "FIFO", "I3", 3, Status.FAILED,
                        'queue kept the oldest keys\n  File "/work/class/alice/lab.py", line 4'
                        "\n  File \"/opt/moco-ref/lib/python3.11/site-packages/torch/nn.py\""
                        "\nrerun: moco-ref grade /work/class/alice/lab.py --check I3"),
            CheckResult("I3-oldest-first-order", "order", "I3", 1, Status.NOT_JUDGED,
                        "needs I3-fifo-keeps-newest to pass first\nmore detail",
                        {"needs": "I3-fifo-keeps-newest"}),
            CheckResult("I6-orders", "step orders", "I6", 2, Status.TIMEOUT, "too slow"),
            CheckResult("B1-ddp", "gathers", "builder", 1, Status.NOT_APPLICABLE, "n/a"),
        ],
        stdout="epoch 1 loss 4.2 written to /tmp/run/log.txt",
        wall_seconds=3.2,
    )
    fields.update(overrides)
    return SubmissionReport(**fields)


def test_results_are_markdown_numbered_tagged_and_student_safe():
    data = gradescope_results(_report())
    assert gradescope_problems(data) == []
    assert [t["number"] for t in data["tests"]] == ["I1.1", "I3.1", "I3.2", "I6.1"]
    fifo, not_judged, timeout = data["tests"][1:]
    assert fifo["tags"] == ["I3", "failed"] and "```text" in fifo["output"]
    assert 'File "lab.py", line 4' in fifo["output"] and 'File "nn.py"' in fifo["output"]
    assert not_judged["status"] == "failed" and not_judged["tags"][1] == "not judged"
    assert "needs I3-fifo-keeps-newest" in not_judged["output"]
    assert "more detail" not in not_judged["output"]
    assert timeout["status"] == "failed" and "Timed out" in timeout["output"]
    text = json.dumps(data)
    assert "/work" not in text and "/opt" not in text and "rerun" not in text
    assert "epoch 1 loss" not in text and data["stdout_visibility"] == "hidden"
    assert "`B1-ddp`" in data["output"]  # not applicable: named, not a test


def test_the_submissions_output_is_shown_only_when_the_rubric_says_so():
    shown = gradescope_results(_report(), rubric=Rubric(show_submission_output=True))
    assert shown["stdout_visibility"] == "visible"
    assert "epoch 1 loss 4.2 written to log.txt" in shown["output"]


def test_student_text_drops_paths_and_local_commands():
    text = ("Traceback:\n  File \"/autograder/submission/pkg/util.py\", line 2\n"
            "see /work/main/moco_ref/grade.py; 1/2 of query/key pairs, a / b\n"
            "moco-ref refuses that. Staff can allow it with `moco-ref grade --allow-x`.\n"
            "rerun: moco-ref grade x.py --check I3")
    safe = student_text(text, "/autograder/submission")
    assert 'File "pkg/util.py"' in safe and "see grade.py;" in safe
    assert "1/2 of query/key pairs, a / b" in safe
    assert "Staff" not in safe and "rerun" not in safe and "moco-ref refuses that." in safe


def test_the_not_gradable_results_hold_one_failed_test():
    report = _report(gradable=False, results=[], traceback=(
        'Traceback (most recent call last):\n  File "/work/class/alice/lab.py", line 1\n'
        "ModuleNotFoundError: No module named 'tensorflow'\n"))
    data = gradescope_results(report)
    assert gradescope_problems(data) == [] and data["score"] == 0
    (test,) = data["tests"]
    assert test["status"] == "failed" and test["visibility"] == "visible"
    assert "No module named 'tensorflow'" in test["output"] and "/work" not in json.dumps(data)


def test_the_schema_rejects_a_missing_max_score_and_an_unknown_status():
    data = gradescope_results(_report())
    assert gradescope_problems(data) == []
    missing = json.loads(json.dumps(data))
    del missing["tests"][0]["max_score"]
    assert any("max_score" in problem for problem in gradescope_problems(missing))
    wrong = json.loads(json.dumps(data))
    wrong["tests"][1]["status"] = "ok"
    assert any(p.startswith("tests/1/status") for p in gradescope_problems(wrong))
    for key, value in (("output_format", "markdown"), ("stdout_visibility", "after_due_date"),
                       ("execution_time", 1.5)):
        bad = dict(data, **{key: value})
        assert gradescope_problems(bad), key
    del data["tests"]
    assert gradescope_problems(data)


# --------------------------------------------------------------------------- PrairieLearn


def test_prairielearn_results_score_a_fraction_with_one_test_per_check(tmp_path):
    rubric = Rubric(visibility={"I6": "hidden"})
    data = prairielearn_results(_report(), rubric)
    # the hidden I6 check is left out, and so are its points (tests/report/test_visibility)
    assert data["gradable"] is True and data["score"] == pytest.approx(2 / 6, abs=1e-6)
    assert [t["name"].split(":")[0] for t in data["tests"]] == [
        "I1-key-grads-none", "I3-fifo-keeps-newest", "I3-oldest-first-order"]
    for test in data["tests"]:
        assert set(test) == {"name", "description", "points", "max_points", "message",
                             "output"}
    first, fifo, not_judged = data["tests"]
    assert (first["points"], first["max_points"]) == (2, 2)
    assert (fifo["points"], fifo["max_points"]) == (0, 3)
    assert fifo["message"] == "failed: queue kept the oldest keys"
    assert 'File "lab.py"' in fifo["output"] and "rerun" not in fifo["output"]
    assert not_judged["output"] == "" and "needs" in not_judged["message"]
    assert "too slow" not in json.dumps(data) and "I6-orders" not in json.dumps(data)
    assert data["output"] == "" and "/work" not in json.dumps(data)
    path = tmp_path / "results.json"
    path.write_text(PRAIRIELEARN.render(_report(), Writing(GradeOptions(), rubric)),
                    encoding="utf-8")
    assert json.loads(path.read_text()) == data


def test_prairielearn_results_of_a_submission_that_is_not_gradable():
    report = _report(gradable=False, results=[], traceback=(
        'Traceback (most recent call last):\n  File "/work/class/alice/lab.py", line 1\n'
        "ModuleNotFoundError: No module named 'tensorflow'\n"))
    data = prairielearn_results(report)
    assert data["gradable"] is False and data["score"] == 0 and data["tests"] == []
    assert data["message"] == "lab.py could not be graded: ModuleNotFoundError: No module " \
        "named 'tensorflow'"
    assert 'File "lab.py", line 1' in data["output"] and "/work" not in json.dumps(data)
    full = _report(results=[CheckResult("I1-a", "a", "I1", 2, Status.PASSED)])
    assert prairielearn_results(full)["score"] == 1.0
    empty = _report(results=[])
    assert prairielearn_results(empty)["score"] == 0.0


# --------------------------------------------------------------------------- staff notes


def _handed_in_nothing(root: Path) -> None:
    (root / "submission").mkdir(parents=True)
    (root / "submission" / "notes.txt").write_text("hi")


def test_a_rubric_total_unlike_the_assignments_is_told_to_the_staff_only(tmp_path, capsys,
                                                                          monkeypatch):
    root = tmp_path / "ag"
    _handed_in_nothing(root)
    (root / "submission_metadata.json").write_text(
        json.dumps({"assignment": {"title": "Lab 7", "total_points": "50.0"}}))
    assert main(["gradescope", "run", "--root", str(root)]) == 0
    captured = capsys.readouterr()
    assert "note for the staff" in captured.err and "total_points is 50" in captured.err
    assert "rubric's total is 100" in captured.err and "total_points" not in captured.out
    results = (root / "results" / "results.json").read_text()
    assert "total_points" not in results and "note for the staff" not in results
    assert gradescope_problems(json.loads(results)) == []

    elsewhere = tmp_path / "metadata.json"  # the path is configurable
    elsewhere.write_text(json.dumps({"assignment": {"total_points": 100}}))
    monkeypatch.setenv("MOCO_REF_SUBMISSION_METADATA", str(elsewhere))
    assert main(["gradescope", "run", "--root", str(root)]) == 0
    assert "note for the staff" not in capsys.readouterr().err  # the totals agree
    elsewhere.write_text("{not json")
    assert main(["gradescope", "run", "--root", str(root), "--metadata", str(elsewhere)]) == 0
    assert "metadata.json could not be read" in capsys.readouterr().err
    monkeypatch.setenv("MOCO_REF_SUBMISSION_METADATA", str(tmp_path / "absent.json"))
    assert grade_in_autograder(root).staff_notes == []
