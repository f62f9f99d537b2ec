"""The adversarial corpus (``examples/adversarial``): submissions that hang, sleep, hog memory,
exit, raise SystemExit/KeyboardInterrupt, leave processes behind, flood their output, plant
fake reports, scribble on file descriptors, patch comparisons, wipe or forge the recorder,
mutate their inputs and import the reference. Each gets the verdict its manifest states, the
grader survives, and no process is left behind — with namespaces where the system has them,
and (for the escapes) with processes alone."""

from __future__ import annotations

import csv
import glob
import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest

import moco_ref
from moco_ref.judge.results import Status, SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC
from moco_ref.probe.options import GradeOptions
from moco_ref.run.batch import grade_folder
from moco_ref.run.demo import (
    DemoOutcome,
    find_manifest,
    load_manifest,
    run_demo,
    surprise_details,
)
from moco_ref.run.pipeline import grade_submission
from moco_ref.sandbox import client
from tests.helpers.grading_stubs.leftovers import wait_for_no_leftovers
from tests.helpers.shared_result import computed_once

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

MANIFEST = find_manifest().parents[1] / "adversarial" / "manifest.json"
EXAMPLES = load_manifest(MANIFEST)
BY_NAME = {example.path.name: example for example in EXAMPLES}
ESCAPES = ("orphan_processes.py", "exit_in_train_moco.py", "stdout_flood.py")


def _grade_the_corpus() -> dict:
    """Every example's report, and what was left once they were graded."""
    for fake in glob.glob("/tmp/moco-ref-fake-*"):
        os.remove(fake)
    graded = run_demo(EXAMPLES, GradeOptions(), jobs=4)  # the hang cases mostly wait
    zygote = client.current_zygote()
    return {"reports": {outcome.example.path.name: outcome.report.to_dict()
                        for outcome in graded},
            "left_behind": wait_for_no_leftovers(),
            "grader_survived": zygote.alive and zygote.process.poll() is None}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """The corpus graded once per test session (the slowest fixture of the suite), shared by
    the xdist workers."""
    return computed_once(tmp_path_factory, "adversarial-corpus", _grade_the_corpus)


@pytest.fixture(scope="module")
def outcomes(corpus) -> dict[str, DemoOutcome]:
    return {name: DemoOutcome(BY_NAME[name], SubmissionReport.from_dict(report))
            for name, report in corpus["reports"].items()}


def test_the_corpus_covers_the_issue():
    assert len(EXAMPLES) >= 15 and all(example.path.exists() for example in EXAMPLES)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_verdict_is_the_expected_one(outcomes, name):
    outcome = outcomes[name]
    assert outcome.as_expected, "\n".join(surprise_details(outcome))


def test_nothing_is_left_behind_and_the_grader_survives(outcomes, corpus):
    assert "spawned 4 processes" in outcomes["orphan_processes.py"].report.stdout
    assert corpus["left_behind"] == []
    assert corpus["grader_survived"]


def _messages(report) -> str:
    return "\n".join(f"{r.check_id} {r.status.value}: {r.message[:300]}" for r in report.results)


def test_timeouts_say_so(outcomes):
    loop = outcomes["infinite_loop.py"].report
    assert any("did not finish within 15 s" in r.message for r in loop.results), \
        _messages(loop)
    slow = outcomes["sleep_in_warmup.py"].report
    assert any("within its 5 s (--check-timeout)" in r.message for r in slow.results), \
        _messages(slow)
    at_import = outcomes["sleep_at_import.py"].report
    assert "timed out after 10 s while loading" in at_import.traceback, at_import.traceback


def test_crashes_say_how(outcomes):
    hog = outcomes["memory_hog.py"].report
    # either way it is told as the job's memory budget, named by its option
    assert any(("MemoryError" in r.message or "processes held" in r.message)
               and "--memory-mb" in r.message for r in hog.results if r.status is Status.ERROR)
    exit_ = outcomes["exit_in_train_moco.py"].report
    assert any("exited with code 0 while it was being observed" in r.message
               for r in exit_.results)
    assert "SystemExit: 0" in outcomes["system_exit_at_import.py"].report.traceback
    interrupted = outcomes["keyboard_interrupt.py"].report
    assert any("KeyboardInterrupt" in r.message for r in interrupted.results)


def test_output_floods_are_capped(outcomes):
    report = outcomes["stdout_flood.py"].report
    assert "bytes of output cut" in report.stdout and len(report.stdout) < 21_000
    assert "bytes of output cut" in report.stderr and len(report.stderr) < 21_000


def test_escape_sequences_never_reach_a_report(outcomes):
    """Every text field of the report (and so of the terminal, JSON, JUnit and Gradescope
    output built from it) is free of escape and control characters, and capped."""
    from moco_ref.judge.untrusted import MAX_TEXT_CHARS

    report = outcomes["escape_sequences.py"].report
    texts = [report.stdout, report.stderr, report.traceback, *report.notes,
             *(r.message for r in report.results)]
    assert any("score 36/36" in text for text in texts)  # the words are kept, shown inert
    for text in texts:
        assert not any(c in text for c in "\x1b\x07\x08\r\x9b\u202e"), repr(text[:200])
        assert len(text) <= MAX_TEXT_CHARS
    assert any("train_moco raised" in r.message for r in report.results)


def test_fake_files_change_nothing(outcomes):
    report = outcomes["fake_report_files.py"].report
    lost = next(r.max_points for r in report.results if r.check_id == "I4-same-source-masked")
    assert report.score == pytest.approx(report.max_score - lost)  # the I4 bug's points only
    assert glob.glob("/tmp/moco-ref-fake-*") == []  # not in its file system


def test_tampering_is_named(outcomes):
    assert "tampered" in outcomes["channel_scribbler.py"].report.traceback
    forged = outcomes["forged_observations.py"].report
    assert any("observations were altered" in r.message for r in forged.results)
    mutated = outcomes["mutates_inputs.py"].report
    assert any("modified its input x" in note for note in mutated.notes)


def test_reference_imports_are_refused_and_noted(outcomes):
    eager = outcomes["imports_reference.py"].report
    assert "refuses to let a submission import its reference" in eager.traceback
    assert "--allow-reference-import" in eager.traceback
    lazy = outcomes["imports_reference_lazily.py"].report
    assert any("moco_ref.core.step" in note and "refused" in note for note in lazy.notes)


def test_the_reference_import_can_be_allowed():
    example = BY_NAME["imports_reference.py"]
    report = grade_submission(str(example.path),
                                     GradeOptions(style="lab", allow_reference_import=True))
    assert report.gradable and not report.notes  # loads; train_moco then raises on its own
    assert any("NotImplementedError" in r.message for r in report.results)


def test_escapes_are_contained_without_namespaces(monkeypatch):
    monkeypatch.setenv(client.ISOLATION_VARIABLE, "processes")
    examples = [BY_NAME[name] for name in ESCAPES]
    for outcome in run_demo(examples, GradeOptions(), jobs=2):
        assert outcome.as_expected, "\n".join(surprise_details(outcome))
    assert wait_for_no_leftovers() == []


# --------------------------------------------------------------------------- the bwrap sandbox


def _attack_line(outcomes, name: str) -> str:
    report = outcomes[name].report
    return "\n".join(line for line in report.stdout.splitlines() if line.startswith("ATTACK"))


def test_no_step_out_of_the_read_only_file_system_succeeds(outcomes):
    lines = _attack_line(outcomes, "remount_and_write.py")
    for step in ("mount_setattr", "remount", "umount", "unshare"):
        assert f"ATTACK {step}: refused" in lines, lines
    assert "ATTACK could write outside the scratch: nothing" in lines


def test_the_grader_s_code_cannot_be_changed_from_inside(outcomes):
    lines = _attack_line(outcomes, "patch_grader.py")
    assert "writable: 0; judge modules: 0" in lines, lines


def test_no_classmate_report_cache_or_grader_command_line_is_visible(outcomes):
    lines = _attack_line(outcomes, "touch_classmates.py")
    assert lines.endswith("grader command lines seen: 0; classmates, reports or cache entries "
                          "found: 0; writable: 0"), lines


def test_no_host_socket_is_reachable(outcomes):
    assert _attack_line(outcomes, "host_sockets.py").endswith("reached: none")


def test_forged_frames_are_refused_cheaply_and_their_notes_appear_nowhere(outcomes):
    forged = outcomes["frame_forgery.py"].report
    assert forged.style == "lab" and forged.gradable
    texts = [forged.traceback, *forged.notes, *(r.message for r in forged.results)]
    assert not any("TA override" in text for text in texts)
    training = [r for r in forged.results if r.family == "I4"]
    assert training and all("not dense" in r.message for r in training)
    assert forged.wall_seconds < 30
    bomb = outcomes["frame_bomb.py"].report
    assert all("tampered" in r.message for r in bomb.results if r.family == "I4")


def test_memory_is_counted_over_the_whole_job(outcomes):
    report = outcomes["memory_fanout.py"].report
    messages = [r.message for r in report.results if r.family == "I4"]
    assert messages and all("processes held" in m and "--memory-mb" in m for m in messages)


def _digests(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file() and "__pycache__" not in
            path.parts}


ATTACKERS = ("touch_classmates.py", "kill_grader.py", "daemon.py", "patch_grader.py",
             "remount_and_write.py", "host_sockets.py")


def test_a_class_under_attack_keeps_its_grades(tmp_path):
    """Correct classmates graded in one batch with the attackers: full marks in the summary,
    in their reports and on a cached rerun; the class folder, the grader's code and the
    reports unchanged afterwards (a daemon would rewrite them); nothing left running. One
    folder per student, each with its own copy of the shared ``_moco.py`` (a flat class
    folder gives no student a helper module: test_students_apart)."""
    adversarial = MANIFEST.parent
    folder = tmp_path / "class"
    sources = {name: name for name in ATTACKERS} | {
        student: "classmate_correct.py" for student in ("alice.py", "zoe.py")}
    for name, source in sources.items():
        student = folder / Path(name).stem
        student.mkdir(parents=True)
        shutil.copy(adversarial / source, student / name)
        shutil.copy(adversarial / "_moco.py", student / "_moco.py")
    out = tmp_path / "out"
    class_before = _digests(folder)
    package = Path(moco_ref.__file__).resolve().parent
    code_before = _digests(package)

    first = grade_folder([folder], GradeOptions(), out=out, jobs=2, per_folder=True)
    scores = {Path(o.report.submission).name: o.report.score for o in first.outcomes}
    full = first.outcomes[0].report.max_score
    assert scores["alice.py"] == scores["zoe.py"] == full
    mask = DEFAULT_RUBRIC.points("lab")["I4-same-source-masked"]
    assert all(scores[name] == pytest.approx(full - mask) for name in ATTACKERS), scores
    outputs = _digests(out)
    time.sleep(3)  # the daemon's moment, had it survived
    assert _digests(out) == outputs
    with open(out / "summary.csv") as handle:
        rows = {Path(row["submission"]).name: row for row in csv.DictReader(handle)}
    assert float(rows["alice.py"]["score"]) == float(rows["zoe.py"]["score"]) == full

    again = grade_folder([folder], GradeOptions(), out=out, jobs=2, per_folder=True)
    assert all(o.cached for o in again.outcomes)
    assert {Path(o.report.submission).name: o.report.score for o in again.outcomes} == scores
    assert _digests(folder) == class_before
    assert _digests(package) == code_before
    assert wait_for_no_leftovers() == []


@pytest.mark.slow  # the whole corpus ten times (~6 min): `pytest -m slow` or `tox -e thorough`
def test_the_same_submission_gets_the_same_report_ten_times_out_of_ten():
    from moco_ref.run.batch import comparable

    for example in EXAMPLES:
        options = GradeOptions.from_dict({**GradeOptions().to_dict(), "style": example.style,
                                          **dict(example.options)})
        reports = {repr(comparable(grade_submission(str(example.path), options)))
                   for _ in range(10)}
        assert len(reports) == 1, example.path.name
