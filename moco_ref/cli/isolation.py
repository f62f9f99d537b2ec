"""``--isolation`` for the commands that run submissions: the flag, starting the warm process
early, and the one line that says why grading is refused when no sandbox can start here."""

from __future__ import annotations

from moco_ref.run.command_line import ISOLATION_HELP, add_isolation_flag  # noqa: F401


def warm_up(isolation: str | None = None) -> None:
    """Start the warm process now without waiting for it, so its torch import runs while this
    process imports the judge (torch too): on two cores the two imports overlap instead of
    adding up. ``isolation_refusal`` then waits for it (or says why it cannot start)."""
    from moco_ref.sandbox.client import current_zygote

    try:
        current_zygote(wait=False, isolation=isolation)
    except Exception:  # noqa: BLE001 - isolation_refusal says why, in one line
        return


def isolation_refusal(isolation: str | None = None) -> str:
    """"" when ``isolation`` (None: the environment's default) can run here (its warm process
    is started), else the one line that says why grading is refused."""
    from moco_ref.sandbox.client import IsolationUnavailable, current_zygote

    try:
        current_zygote(isolation=isolation)
    except IsolationUnavailable as exc:
        return (f"the sandbox cannot run here: {exc}. Untrusted code is not graded without it; "
                "for code you trust, add --isolation processes")
    except ValueError as exc:  # a bad MOCO_REF_ISOLATION
        return str(exc)
    return ""


PLUGIN_ISOLATION_HELP = (
    "how the implementation runs, as grade --isolation: sandbox (default) for code you did not "
    "write; processes for your own, trusted code (no sandbox: it runs as you, with your files, "
    "and sees editable installs and PYTHONPATH as you do). To judge your MoCo inside your own "
    "test process instead, use moco_ref.trace")
