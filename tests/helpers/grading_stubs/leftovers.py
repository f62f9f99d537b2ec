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


def _zygotes() -> tuple[set[int], set[int]]:
    """``(the zygotes' own processes, the warm processes jobs are forked from)``. A sandboxed
    zygote is ``bwrap → bwrap (its pid 1) → python``; its jobs carry no tag (bwrap clears
    the environment), so what is left of them is found as the python's descendants."""
    from moco_ref.sandbox import client

    own, warm = set(), set()
    table = procs.all_processes()
    for zygote in list(client._ZYGOTES.values()):
        pid = zygote.process.pid
        own.add(pid)
        while getattr(zygote, "sandboxed", False) and _is_bwrap(pid):
            children = [info.pid for info in table.values() if info.ppid == pid]
            if len(children) != 1:
                break
            pid = children[0]
            own.add(pid)
        warm.add(pid)
    return own, warm


def _is_bwrap(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().split(b"\0", 1)[0].endswith(b"bwrap")
    except OSError:
        return False


def leftovers() -> list[tuple[int, str]]:
    """``(pid, command line)`` of live tagged processes other than this one and the zygotes,
    and of live processes still under a sandboxed zygote."""
    own, warm = _zygotes()
    mine = {os.getpid()} | own
    in_sandbox = procs.descendants(warm)
    found = []
    for info in procs.all_processes().values():
        if not info.alive or info.pid in mine:
            continue
        if info.pid in in_sandbox or procs.environ_has(info.pid, _ENTRY) or \
                procs.cmdline_has(info.pid, TAG.encode()):
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
