"""Which isolation grades a submission: the ladder's strongest rung by default (bwrap, else
confined), refused in one line only where no rung can run, ``--isolation processes`` only
when asked for, and the report says which was in force."""

from __future__ import annotations

import json
import os
import stat

import pytest

from moco_ref.cli import main
from moco_ref.sandbox import bwrap, client

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "submissions",
                       "correct_lab_order.py")
NO_USERNS = ("bwrap: No permissions to create a new namespace, likely because the kernel "
             "does not allow non-privileged user namespaces.")


@pytest.fixture
def no_zygotes(monkeypatch):
    """A fresh zygote cache: the test's own sandbox is started (or refused) anew."""
    monkeypatch.setattr(client, "_ZYGOTES", {})
    monkeypatch.setenv(client.ISOLATION_VARIABLE, "bwrap")  # the default; undone afterwards


def _fake_bwrap(tmp_path, message: str) -> str:
    path = tmp_path / "bwrap"
    path.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    # run by the sandbox's own host user when the grader is root: readable by all
    path.chmod(path.stat().st_mode | stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP
               | stat.S_IROTH | stat.S_IXOTH)
    return str(path)


@pytest.mark.parametrize(("found", "reason"), [
    ("refuses", "No permissions to create a new namespace"),
    ("missing", "no bwrap"),
])
def test_grading_is_refused_in_one_line_when_bwrap_cannot_run(tmp_path, monkeypatch, capsys,
                                                              no_zygotes, found, reason):
    fake = _fake_bwrap(tmp_path, NO_USERNS) if found == "refuses" else None
    monkeypatch.setattr(bwrap, "executable", lambda: fake)
    assert main(["grade", EXAMPLE]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "the sandbox cannot run here" in err and reason in err
    assert "--isolation processes" in err and "Traceback" not in err


def test_processes_isolation_is_used_only_when_asked_and_is_reported(capsys, no_zygotes):
    assert main(["grade", "--isolation", "processes", "--json", EXAMPLE]) == 0
    report = json.loads(capsys.readouterr().out)
    report = report["reports"][0]
    assert report["isolation"].startswith("processes: for trusted code only")


def test_the_default_isolation_is_bwrap_and_the_report_says_so(capsys):
    assert main(["grade", "--json", EXAMPLE]) == 0
    report = json.loads(capsys.readouterr().out)
    report = report["reports"][0]
    assert report["isolation"].startswith("bwrap: ") and "seccomp" in report["isolation"]
    assert report["score"] == report["max_score"]


def test_the_ladder_falls_to_the_confined_rung_when_bwrap_cannot_run(tmp_path, monkeypatch,
                                                                     capsys, no_zygotes):
    """bwrap refused (as in a default container) and the default isolation: the confined
    rung grades, and the report names it."""
    monkeypatch.setenv(client.ISOLATION_VARIABLE, "sandbox")
    fake = _fake_bwrap(tmp_path, NO_USERNS)
    monkeypatch.setattr(bwrap, "executable", lambda: fake)
    assert main(["grade", "--json", EXAMPLE]) == 0
    report = json.loads(capsys.readouterr().out)["reports"][0]
    assert report["isolation"].startswith("confined (no namespaces here): Landlock ABI")
    assert report["score"] == 100


def test_grading_is_refused_naming_every_rung_when_none_can_start(tmp_path, monkeypatch,
                                                                  capsys, no_zygotes):
    monkeypatch.setenv(client.ISOLATION_VARIABLE, "sandbox")
    fake = _fake_bwrap(tmp_path, NO_USERNS)
    monkeypatch.setattr(bwrap, "executable", lambda: fake)

    def no_landlock(self, *args):
        raise OSError(38, "Landlock is not available here")

    monkeypatch.setattr(client.Zygote, "_confined_start", no_landlock)
    assert main(["grade", EXAMPLE]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert "no rung of the isolation ladder can start here" in err
    assert "bwrap: " in err and "No permissions to create a new namespace" in err
    assert "confined: " in err and "Landlock is not available here" in err


def test_a_sandbox_first_needed_by_a_short_lived_thread_outlives_that_thread(no_zygotes):
    """A grading pool's thread may be the first to need the sandbox (or the first after one
    died); the pool's threads end with the pool, and bwrap's ``--die-with-parent`` follows
    the thread that forked it, so the sandbox must be started by a thread that lasts."""
    import threading
    import time

    started = []
    first = threading.Thread(target=lambda: started.append(client.current_zygote()))
    first.start()
    first.join()
    time.sleep(1.0)  # a parent-death signal would have arrived by now
    zygote = started[0]
    assert zygote.process.poll() is None, "the sandbox died with the thread that needed it"
    assert client.current_zygote() is zygote  # the same one, still in use
