"""Finding processes a graded submission left behind, by a tag in their environment.

Importing this module sets ``MOCO_REF_TEST_RUN=<random>`` in this process's environment, so
every zygote started afterwards — and every process forked or exec'd below it, unless it
clears its environment — carries the tag in ``/proc/PID/environ``. Adversarial examples that
exec with a cleared environment put ``$MOCO_REF_TEST_RUN`` in their command line instead.
``leftovers()`` lists the live tagged processes that are not a running zygote: after grading,
there must be none. Processes of other test runs on the same machine carry other tags.
"""

from __future__ import annotations

import os
import time
import uuid

from moco_ref.sandbox import procs

VARIABLE = "MOCO_REF_TEST_RUN"
TAG = os.environ.setdefault(VARIABLE, uuid.uuid4().hex)
_ENTRY = f"{VARIABLE}={TAG}".encode()


def _zygote_pids() -> set[int]:
    from moco_ref.sandbox import client

    return {zygote.process.pid for zygote in client._ZYGOTES.values()}


def leftovers() -> list[tuple[int, str]]:
    """``(pid, command line)`` of live tagged processes other than this one and the zygotes."""
    mine = {os.getpid()} | _zygote_pids()
    found = []
    for info in procs.all_processes().values():
        if not info.alive or info.pid in mine:
            continue
        if procs.environ_has(info.pid, _ENTRY) or procs.cmdline_has(info.pid, TAG.encode()):
            try:
                with open(f"/proc/{info.pid}/cmdline", "rb") as handle:
                    command = handle.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                command = "?"
            found.append((info.pid, command.strip()))
    return found


def wait_for_no_leftovers(seconds: float = 5.0) -> list[tuple[int, str]]:
    """Leftovers still alive after ``seconds`` (killed processes take a moment to go)."""
    deadline = time.monotonic() + seconds
    while True:
        found = leftovers()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
