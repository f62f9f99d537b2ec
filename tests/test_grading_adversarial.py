"""The adversarial corpus (``examples/adversarial``): submissions that hang, sleep, hog memory,
exit, raise SystemExit/KeyboardInterrupt, leave processes behind, flood their output, plant
fake reports, scribble on file descriptors, patch comparisons, wipe or forge the recorder,
mutate their inputs and import the reference. Each gets the verdict its manifest states, the
grader survives, and no process is left behind — with namespaces where the system has them,
and (for the escapes) with processes alone."""

from __future__ import annotations

import glob
import os

import pytest
from grading_stubs.leftovers import wait_for_no_leftovers

from moco_ref.grade import grade_submission
from moco_ref.judge.results import Status
from moco_ref.observe.options import GradeOptions
from moco_ref.report.demo import (
    DemoOutcome,
    find_manifest,
    load_manifest,
    run_demo,
    surprise_details,
)
from moco_ref.sandbox import client

MANIFEST = find_manifest().parents[1] / "adversarial" / "manifest.json"
EXAMPLES = load_manifest(MANIFEST)
BY_NAME = {example.path.name: example for example in EXAMPLES}
ESCAPES = ("orphan_processes.py", "exit_in_train_moco.py", "stdout_flood.py")


@pytest.fixture(scope="module")
def outcomes() -> dict[str, DemoOutcome]:
    for fake in glob.glob("/tmp/moco-ref-fake-*"):
        os.remove(fake)
    graded = run_demo(EXAMPLES, GradeOptions(), jobs=4)  # the hang cases mostly wait
    return {outcome.example.path.name: outcome for outcome in graded}


def test_the_corpus_covers_the_issue():
    assert len(EXAMPLES) >= 15 and all(example.path.exists() for example in EXAMPLES)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_verdict_is_the_expected_one(outcomes, name):
    outcome = outcomes[name]
    assert outcome.as_expected, "\n".join(surprise_details(outcome))


def test_nothing_is_left_behind_and_the_grader_survives(outcomes):
    assert "spawned 4 processes" in outcomes["orphan_processes.py"].report.stdout
    assert wait_for_no_leftovers() == []
    zygote = client.zygote_for(client.child_environment())
    assert zygote.alive and zygote.process.poll() is None


def test_timeouts_say_so(outcomes):
    loop = outcomes["infinite_loop.py"].report
    assert any("did not finish within 15 s" in r.message for r in loop.results)
    slow = outcomes["sleep_in_warmup.py"].report
    assert any("within its 5 s (--check-timeout)" in r.message for r in slow.results)
    assert "timed out after 10 s while loading" in outcomes["sleep_at_import.py"].report.traceback


def test_crashes_say_how(outcomes):
    hog = outcomes["memory_hog.py"].report
    assert any("MemoryError" in r.message for r in hog.results if r.status is Status.ERROR)
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
    assert report.score == 34
    if client.zygote_for(client.child_environment()).namespaces:
        assert glob.glob("/tmp/moco-ref-fake-*") == []  # read-only outside its scratch


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
