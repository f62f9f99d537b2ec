"""The course's probe secret never travels in a command line (``/proc/PID/cmdline`` is readable
by every process, a confined job's included): ``--probe-secret`` takes a file or ``-`` for
stdin, and a job on either rung finds the secret in no process's command line or
environment."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from moco_ref.cli.grade import probe_secret_of
from moco_ref.cli.main import main
from moco_ref.probe.options import probe_key_of

SECRET = "course secret 7f3a"


def test_the_secret_is_read_from_a_file_or_stdin_never_taken_from_argv(tmp_path, monkeypatch):
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    assert probe_secret_of(str(path)) == SECRET.encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(SECRET.encode())))
    assert probe_secret_of("-") == SECRET.encode()
    monkeypatch.setenv("MOCO_REF_PROBE_SECRET", SECRET)
    assert probe_key_of(probe_secret_of(None)) == probe_key_of(SECRET)  # the same probe
    with pytest.raises(ValueError, match="never the secret itself"):
        probe_secret_of(SECRET)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        probe_secret_of(str(tmp_path / "empty"))


def test_a_secret_given_as_text_is_one_clear_line_and_exit_2(tmp_path, capsys):
    assert main(["grade", str(tmp_path), "--probe-secret", SECRET]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "never the secret itself" in err[0]


PEEK = '''
import os
found = []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for name in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as file:
                if b"%s" in file.read():
                    found.append(f"{pid}/{name}")
        except OSError:
            pass
print("PEEK-RESULT", "SEEN " + ",".join(found) if found else "unseen")
'''


@pytest.mark.slow
@pytest.mark.parametrize("rung", ["bwrap", "confined"])
def test_a_job_never_sees_the_secret(tmp_path, rung):
    """A submission that reads every /proc/PID/cmdline and environ it can: the grader was given
    the secret by file, on both rungs, two jobs at once."""
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    folder = tmp_path / "class"
    folder.mkdir()
    for name in ("alice.py", "bob.py"):
        (folder / name).write_text(PEEK % SECRET.encode().decode() +
                                   "\ndef moco_warmup():\n    return {}\n")
    env = {k: v for k, v in os.environ.items() if k != "MOCO_REF_PROBE_SECRET"}
    done = subprocess.run(
        [sys.executable, "-m", "moco_ref.cli", "grade", str(folder), "--out",
         str(tmp_path / "out"), "-j", "2", "--isolation", rung, "--probe-secret",
         str(secret_file)], capture_output=True, text=True, timeout=900, env=env)
    reports = [json.loads((tmp_path / "out" / f"{name}.json").read_text())["reports"][0]
               for name in ("alice.py", "bob.py")]
    for report in reports:
        assert "PEEK-RESULT unseen" in report["stdout"], \
            report["stdout"][-500:] + done.stderr[-2000:]
