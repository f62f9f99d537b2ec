"""An expensive result computed once per test session, by whichever xdist worker asks first.

A module-scoped fixture is built once per *worker*: with ``-n 2`` both workers run some of a
module's parametrized tests, so both would build it. ``computed_once`` keeps the result as
JSON in the session's shared temporary folder under a file lock: the first worker computes
it, the others wait for it and read it. Without xdist it is computed in place.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path


def session_folder(tmp_path_factory) -> Path:
    """The temporary folder every worker of this test session shares (and no other session)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def computed_once(tmp_path_factory, name: str, compute: Callable[[], dict]) -> dict:
    """``compute()`` (a JSON-able dict) once per session; every caller gets it as read back
    from JSON, the computing one too, so all see the same thing."""
    folder = session_folder(tmp_path_factory)
    path = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(compute()))
            partial.replace(path)
        return json.loads(path.read_text())
