"""Batch grading: a folder in parallel, one report per submission, summaries, deterministic
shards, a cache of unchanged submissions, and reports that are the same every time."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest

from moco_ref.cli import main
from moco_ref.platforms import writers
from moco_ref.probe.options import GradeOptions
from moco_ref.run.batch import comparable, grade_folder
from moco_ref.run.cache import cache_key
from moco_ref.run.intake import find_targets
from moco_ref.run.pipeline import grade_submission
from moco_ref.run.targets import TargetError, parse_shard, shard_of
from tests.helpers.grading_stubs.fixtures import BAD_FIFO_WARMUP, GOOD_WARMUP, stubbed, write  # noqa: F401

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "submissions"
ENTRY = "\ndef train_moco(*args):\n    return None\n"


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "class"
    (root / "group-b").mkdir(parents=True)
    # each defines train_moco, so none is a helper module of another (copy_submission)
    write(root, "alice.py", GOOD_WARMUP + ENTRY)
    write(root, "bob.py", BAD_FIFO_WARMUP + ENTRY)
    write(root / "group-b", "carol.py", GOOD_WARMUP + ENTRY)
    write(root, "_helper.py", "X = 1")  # private: not a submission
    (root / ".ipynb_checkpoints").mkdir()
    write(root / ".ipynb_checkpoints", "alice-checkpoint.py", GOOD_WARMUP)
    return root


def test_targets_are_found_recursively_with_stable_names(folder):
    names = [target.name for target in find_targets([folder])]
    assert names == ["alice.py", "bob.py", "group-b/carol.py"]
    empty = folder.parent / "empty"
    empty.mkdir()
    write(empty, "README.md", "no submissions here")
    with pytest.raises(TargetError, match="no submissions"):
        find_targets([empty])


def test_shards_partition_deterministically():
    names = [f"student{i:03d}/moco.ipynb" for i in range(200)]
    shards = [shard_of(name, 4) for name in names]
    assert shards == [shard_of(name, 4) for name in reversed(names)][::-1]  # order-free
    assert set(shards) == {1, 2, 3, 4} and min(shards.count(s) for s in range(1, 5)) > 30
    assert shard_of("alice.py", 4) == 1 + int.from_bytes(
        __import__("hashlib").sha256(b"alice.py").digest()[:8], "big") % 4  # documented rule
    assert parse_shard("2/5") == (2, 5)
    for bad in ("0/5", "6/5", "x", "1/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)


@pytest.mark.usefixtures("stubbed")
def test_a_folder_is_graded_into_reports_and_summaries(folder, tmp_path):
    out = tmp_path / "reports"
    seen = []
    table = writers()
    result = grade_folder([folder], GradeOptions(), out=out, jobs=2,
                          writers=[table["gradescope"], table["junit"]], on_done=seen.append)
    assert sorted(outcome.target.name for outcome in seen) == [
        "alice.py", "bob.py", "group-b/carol.py"]
    assert [o.report.score for o in result.outcomes] == [3, 2, 3]
    files = sorted(path.name for path in out.iterdir() if path.is_file())
    for stem in ("alice.py", "bob.py", "group-b__carol.py"):
        assert {f"{stem}.json", f"{stem}.gradescope.json", f"{stem}.junit.xml"} <= set(files)
    report = json.loads((out / "bob.py.json").read_text())["reports"][0]
    assert report["score"] == 2 and report["results"][0]["status"] == "failed"
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["submission"], r["score"], r["max_score"], r["failed_checks"]) for r in rows] == [
        ("alice.py", "3.0", "3.0", ""), ("bob.py", "2.0", "3.0", "W1-warmup-fifo"),
        ("group-b/carol.py", "3.0", "3.0", "")]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["graded"] == 3 and summary["cached"] == 0 and summary["isolation"]
    assert all(row["wall_seconds"] > 0 for row in summary["submissions"])


@pytest.mark.usefixtures("stubbed")
def test_unchanged_submissions_come_from_the_cache(folder, tmp_path):
    out, options = tmp_path / "reports", GradeOptions()
    first = grade_folder([folder], options, out=out, jobs=2)
    again = grade_folder([folder], options, out=out, jobs=2)
    assert [o.cached for o in again.outcomes] == [True, True, True]
    assert [comparable(o.report) for o in again.outcomes] == [
        comparable(o.report) for o in first.outcomes]
    write(folder, "bob.py", GOOD_WARMUP + ENTRY)  # bob fixes his bug
    changed = grade_folder([folder], options, out=out, jobs=2)
    assert [o.cached for o in changed.outcomes] == [True, False, True]
    assert changed.outcomes[1].report.score == 3
    forced = grade_folder([folder], options, out=out, jobs=2, force=True)
    assert not any(o.cached for o in forced.outcomes)
    other = grade_folder([folder], GradeOptions(seed=3), out=out, jobs=2)  # options are in the key
    assert not any(o.cached for o in other.outcomes)


@pytest.mark.usefixtures("stubbed")
def test_only_entries_the_grader_signed_come_from_the_cache(folder, tmp_path):
    """A forged entry (the key is computable by anyone), one whose report was edited, and one
    signed with another secret are all ignored: the submission is graded anew."""
    import json
    import stat

    from moco_ref.run.cache import CACHE_FOLDER, SECRET_FILE, _cache_file

    out, options = tmp_path / "reports", GradeOptions()
    grade_folder([folder], options, out=out, jobs=1)
    secret = out / CACHE_FOLDER / SECRET_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    bob = next(t for t in find_targets([folder]) if t.name.endswith("bob.py"))
    entry = _cache_file(out, cache_key(bob, options))
    signed = json.loads(entry.read_text())
    assert grade_folder([folder], options, out=out).outcomes[1].cached

    def graded_again(data) -> bool:
        entry.write_text(json.dumps(data))
        outcome = grade_folder([folder], options, out=out).outcomes[1]
        return not outcome.cached and outcome.report.score < outcome.report.max_score

    full = {**signed["report"], "results": [{**r, "status": "passed"}
                                            for r in signed["report"]["results"]]}
    assert graded_again({"key": signed["key"], "report": full})  # forged: no MAC
    assert graded_again({**signed, "report": full})  # edited after signing
    secret.write_bytes(b"another grader's secret")
    assert graded_again(signed)  # signed under another secret


def test_the_cache_key_names_content_helpers_options_isolation_and_grader(folder,
                                                                          monkeypatch):
    from moco_ref.sandbox.client import ISOLATION_VARIABLE

    # a flat folder's siblings are never helpers (test_students_apart): as if its own folder
    target = replace(find_targets([folder])[0], helpers=True)
    key = cache_key(target, GradeOptions())
    assert key == cache_key(target, GradeOptions())
    assert key != cache_key(target, GradeOptions(temperature=0.1))
    monkeypatch.setenv(ISOLATION_VARIABLE, "processes")
    assert key != cache_key(target, GradeOptions())
    monkeypatch.setenv(ISOLATION_VARIABLE, "bwrap")
    write(folder, "_helper.py", "X = 2")  # a helper module the submission's process gets
    assert key != cache_key(target, GradeOptions())
    key = cache_key(target, GradeOptions())
    Path(target.path).write_text(GOOD_WARMUP + "\n# edited\n")
    assert key != cache_key(target, GradeOptions())


@pytest.mark.usefixtures("stubbed")
def test_shards_of_a_folder_grade_each_submission_once(folder, tmp_path):
    out = tmp_path / "reports"
    graded = []
    for index in (1, 2, 3):
        result = grade_folder([folder], GradeOptions(), out=out, jobs=1, shard=(index, 3))
        graded += [o.target.name for o in result.outcomes]
        assert (out / f"summary-{index}-of-3.csv").exists()
    assert sorted(graded) == ["alice.py", "bob.py", "group-b/carol.py"]


@pytest.mark.usefixtures("stubbed")
def test_grade_command_in_batch(folder, tmp_path, capsys):
    out = tmp_path / "reports"
    code = main(["grade", str(folder), "-j", "2", "--out", str(out), "--junit"])
    assert code == 1  # bob is below full marks
    printed = capsys.readouterr()
    assert "3 submission(s) (3 graded, 0 from the cache)" in printed.out
    assert "1 of 3 submission(s) below full marks: bob.py" in printed.out
    assert "[3/3]" in printed.err  # progress, one line per submission when not a terminal
    assert (out / "bob.py.junit.xml").exists() and not (out / "bob.py.gradescope.json").exists()
    assert main(["grade", str(folder), "--out", str(out), "--json", "--min-score", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["cached"] == 3
    assert main(["grade", str(folder), "--gradescope", "x.json"]) == 2
    assert main(["grade", str(folder), "--shard", "4/3"]) == 2


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_reports_are_deterministic_with_the_real_harness():
    """The same submission, graded twice in fresh processes, gives the same report."""
    for name in ("correct_lab_order.py", "bug_queue_keeps_oldest.py", "components_correct.py"):
        first = grade_submission(str(EXAMPLES / name))
        second = grade_submission(str(EXAMPLES / name))
        assert first.gradable and comparable(first) == comparable(second), name


def test_ctrl_c_stops_cleanly_and_writes_the_partial_summary(tmp_path, monkeypatch, capsys):
    """Ctrl-C during a batch: one line, exit 130, and the summary of what was graded."""
    import moco_ref.run.pipeline as grading
    from moco_ref.cli import main
    from moco_ref.judge.results import SubmissionReport

    folder = tmp_path / "class"
    folder.mkdir()
    for name in ("a.py", "b.py", "c.py"):
        (folder / name).write_text("def train_moco():\n    pass\n")
    seen = []

    def fake(target, options=None, isolation=None, helpers=True):
        if len(seen) == 1:
            raise KeyboardInterrupt
        seen.append(target)
        return SubmissionReport(target, "lab", gradable=True)

    monkeypatch.setattr(grading, "grade_submission", fake)
    out = tmp_path / "out"
    assert main(["grade", str(folder), "--out", str(out), "-j", "1"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("moco-ref: interrupted") and not any("Traceback" in e for e in err)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and len(summary["submissions"]) == 1


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
@pytest.mark.usefixtures("stubbed")
def test_a_class_is_graded_with_its_own_probe_kept_beside_its_cache(folder, tmp_path, capsys,
                                                                    monkeypatch):
    """Batch grading draws the probe from the course's secret, made on first use beside the
    cache secret (owner-only) and kept: a rerun meets the same probe (so the cache holds),
    another --probe-secret is another probe (so nothing comes from the cache)."""
    import stat

    monkeypatch.delenv("MOCO_REF_PROBE_SECRET", raising=False)

    out = tmp_path / "reports"
    main(["grade", str(folder), "--out", str(out)])
    secret = out / ".cache" / ".probe-secret"
    assert secret.is_file() and stat.S_IMODE(secret.stat().st_mode) == 0o600
    kept = secret.read_bytes()
    capsys.readouterr()
    main(["grade", str(folder), "--out", str(out)])
    assert "(0 graded, 3 from the cache)" in capsys.readouterr().out
    assert secret.read_bytes() == kept
    another = tmp_path / "another-course.secret"
    another.write_text("another course\n")
    main(["grade", str(folder), "--out", str(out), "--probe-secret", str(another)])
    assert "(3 graded, 0 from the cache)" in capsys.readouterr().out


def test_a_class_summary_fits_a_screen_whatever_its_size():
    """Batch grading's terminal: counts by status, a score histogram, the families failed
    most often — the same few lines for 3 students or 300, none wider than 80 columns, and
    no student named (their detail is in the files)."""
    from moco_ref.cli.grade_batch import batch_summary_lines
    from moco_ref.judge.results import CheckResult, Status, SubmissionReport
    from moco_ref.run.batch import BatchResult, Outcome
    from moco_ref.run.targets import Target

    def student(n: int) -> Outcome:
        failed = n % 3 == 0
        results = [CheckResult("I4-same-source-masked", "mask", "I4", 10.0,
                               Status.FAILED if failed else Status.PASSED, "x"),
                   CheckResult("I3-fifo-keeps-newest", "fifo", "I3", 90.0, Status.PASSED)]
        report = SubmissionReport(f"student_{n}.py", "lab", n % 10 != 7, results)
        return Outcome(Target(f"student_{n}.py", f"student_{n}.py"), report)

    for size in (3, 300):
        lines = batch_summary_lines(BatchResult(outcomes=[student(n) for n in range(size)]),
                                    width=80)
        assert len(lines) <= 10 and all(len(line) <= 80 for line in lines), lines
        assert not any("student_" in line for line in lines)
    text = "\n".join(lines)
    assert text.startswith("300 submission(s): ")
    below = sum(1 for n in range(300) if n % 10 != 7 and n % 3 == 0)
    assert f"{below} below" in text and "30 not gradable" in text
    assert f"failed most often: I4 ({below})" in text
