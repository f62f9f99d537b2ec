"""``moco-ref doctor`` reports from inside the sandbox what a submission can see and do."""

from __future__ import annotations

import json
import os
import re

from moco_ref.cli import main
from moco_ref.sandbox import client

KEYS = {"uid", "gid", "cwd", "CapEff", "CapBnd", "NoNewPrivs", "Seccomp", "processes visible",
        "network", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE"}


def test_doctor_reports_from_inside_the_sandbox(capsys):
    assert main(["doctor", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    inside = found["inside"]
    assert KEYS <= set(inside)
    assert {f"{verb} {place}" for verb in ("read", "write")
            for place in ("home", "project", "host /tmp", "the submission's folder")} <= set(inside)
    assert "/moco-ref-grade-" in inside["cwd"]  # the job's own scratch, not the grader's folder
    assert inside["RLIMIT_CORE"] == "0" and inside["RLIMIT_FSIZE"] == str(2**30)
    assert found["isolation"] == client.isolation_description()


def test_doctor_in_processes_mode_runs_as_the_grader(monkeypatch, capsys):
    monkeypatch.setenv(client.ISOLATION_VARIABLE, "processes")
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("isolation: processes")
    assert re.search(rf"^  uid +{os.getuid()}$", text, re.MULTILINE), text
