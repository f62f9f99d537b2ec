"""Trying a platform's grader here as the platform would run it: run its entry in a tree
shaped like the platform's, within a time, then read the results it wrote and list what the
platform's format finds wrong with them (each platform's ``local_run`` lays out its tree)."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TryResult:
    root: Path
    returncode: int
    data: dict | None
    problems: list[str] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""

    @property
    def valid(self) -> bool:
        return self.data is not None and not self.problems


def run_and_validate(argv: list[str], *, root: Path, env: dict, timeout: float, results: Path,
                     what: str, problems_of) -> TryResult:
    """Run a platform's entry (``argv``, named ``what`` in the problems) in ``root`` within
    ``timeout`` seconds, then read ``results`` and list what ``problems_of`` finds wrong with
    it (shared by ``gradescope test`` and ``prairielearn test``)."""
    started = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, stdout = -1, _text(exc.stdout)
        stderr = _text(exc.stderr) + (f"\n{what} ran out of its {timeout:g} s (after "
                                      f"{time.monotonic() - started:.0f} s)")
    if not results.is_file():
        return TryResult(root, returncode, None,
                         [f"{what} wrote no {results.parent.name}/{results.name}"],
                         stdout, stderr)
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return TryResult(root, returncode, None, [f"{results.name} is not JSON: {exc}"],
                         stdout, stderr)
    return TryResult(root, returncode, data, problems_of(data), stdout, stderr)


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
