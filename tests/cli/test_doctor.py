"""``moco-ref doctor`` reports from inside the sandbox what a submission can see and do."""

from __future__ import annotations

import json
import os
import re

import pytest

from moco_ref.cli import main
from moco_ref.sandbox import bwrap, client

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

KEYS = {"uid", "gid", "cwd", "CapEff", "CapBnd", "NoNewPrivs", "Seccomp", "processes visible",
        "network", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE",
        "device nodes", "/dev/shm", "terminals (/dev/pts)"}


def test_doctor_reports_from_inside_the_sandbox(capsys):
    """The bwrap sandbox's promises, as the submission sees them: an unprivileged user with
    no capabilities, no_new_privs, a seccomp filter, only its own processes, no network,
    nothing of the grader's to read or write."""
    assert main(["doctor", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    inside = found["inside"]
    assert KEYS <= set(inside)
    assert found["isolation"] == client.isolation_description()
    assert found["isolation"].startswith("bwrap")
    assert (inside["uid"], inside["gid"]) == ("65534", "65534")
    assert inside["CapEff"] == inside["CapBnd"] == "0000000000000000"
    assert inside["NoNewPrivs"] == "1" and inside["Seccomp"] == "2"  # 2: a filter
    assert inside["processes visible"] == "2"  # the job's init and the submission
    assert inside["network"].startswith("no internet")
    assert inside["cwd"] == "/tmp/work"  # the job's own scratch
    assert inside["RLIMIT_CORE"] == "0" and inside["RLIMIT_FSIZE"] == str(2**30)
    for place in ("home", "project", "/"):
        assert inside[f"write {place}"].startswith("no"), place
    for place in ("the submission's folder", "the package"):  # not in its file system at all
        assert inside[f"read {place}"] == "no (FileNotFoundError)", place
    assert inside["read project"] in ("yes (1 entries)", "no (FileNotFoundError)")  # a .venv
    assert "mount_setattr" in found["seccomp refuses"]
    # the host's device nodes cannot be changed; its own small /dev/shm, no one else's ptys
    assert inside["device nodes"].startswith("read-only (chmod and chown refused"), inside
    assert inside["/dev/shm"] == "64 MB" and inside["terminals (/dev/pts)"] == "ptmx"
    # an unprivileged host uid: one of its own when the grader is root, else the grader's
    host = found["host uid"]
    uid = int(host.split()[0])
    if os.geteuid() == 0:
        assert uid in bwrap.HOST_IDS and "named by no account" in host, host
    else:
        assert uid == os.getuid() and "the grader's own" in host, host
    assert f"maps 0 {uid} 1" in host, host


def test_doctor_in_processes_mode_runs_as_the_grader(monkeypatch, capsys):
    monkeypatch.setenv(client.ISOLATION_VARIABLE, "processes")
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("rung in force: processes\nisolation: processes")
    assert re.search(rf"^  uid +{os.getuid()}$", text, re.MULTILINE), text
    assert f"host uid of the submission's processes: {os.getuid()} (the grader's own" in text
