"""What every command of moco-ref shares, whichever package defines it (``moco_ref.cli`` and
each learning platform's package in ``moco_ref.platforms``): the exit codes, the one line of
a usage error, and the ``--isolation`` flag."""

from __future__ import annotations

import sys

EXIT_OK, EXIT_BELOW, EXIT_USAGE = 0, 1, 2

ISOLATION_HELP = (
    "sandbox (default): the strongest rung that starts here, bwrap else confined; grading is "
    "refused only where neither can run. bwrap: a bubblewrap sandbox (namespaces of its own, "
    "uid 65534 without capabilities, seccomp, nothing to read but its own files). confined: "
    "no namespaces (a default Docker container): an unprivileged uid per job, Landlock, "
    "seccomp, rlimits. processes: FOR TRUSTED CODE ONLY (the submission runs as you, with "
    "your files)")


def usage_error(message: str) -> int:
    """One clear line on stderr, and the usage exit code (the message may name a student's
    file: it is shown as ``text.shown_name`` shows names)."""
    from moco_ref.report.text import shown_name

    print(f"moco-ref: error: {shown_name(message, cap=4096)}", file=sys.stderr)
    return EXIT_USAGE


def add_isolation_flag(group, *, help_text: str = ISOLATION_HELP) -> None:
    from moco_ref.sandbox.client import ISOLATION_MODES

    group.add_argument("--isolation", choices=ISOLATION_MODES, default=None, help=help_text)
