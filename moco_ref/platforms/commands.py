"""What the commands of every platform's package share: the end of a local try (``test``)
and a run that writes the platform's results even when the grader itself fails (``run``)."""

from __future__ import annotations

from moco_ref.run.command_line import EXIT_BELOW as EXIT_INVALID
from moco_ref.run.command_line import EXIT_OK, usage_error


def tried_outcome(tried, program: str, *, keep: bool) -> int:
    """The end of ``gradescope test`` and ``prairielearn test``: how ``program`` exited (the
    last lines it wrote, inert), whether the results are valid (each problem, inert), where
    the tree was kept; the exit code."""
    from moco_ref.report.text import shown_name

    if tried.returncode != 0:
        print(f"{program} exited with {tried.returncode}")
        for line in tried.stderr.strip().splitlines()[-5:]:
            print(f"  | {shown_name(line)}")
    if tried.valid:
        print("results.json: valid")
    else:
        print("results.json: INVALID")
        for problem in tried.problems[:20]:
            print(f"  - {shown_name(str(problem))}")
        if len(tried.problems) > 20:
            print(f"  … and {len(tried.problems) - 20} more")
    if keep:
        print(f"kept: {tried.root}")
    return EXIT_OK if tried.valid else EXIT_INVALID


def graded_or_failed(grade, write_failure, root, rubric_owner: str):
    """``grade()``'s ``RunResult``; or, when the bundled rubric is unusable or the grader
    itself fails, the exit code after ``write_failure(root, seconds)`` has written the
    platform's results all the same (the student's results say the grader failed; the staff
    get the traceback on stderr)."""
    import time
    import traceback

    from moco_ref.judge.rubric import RubricError

    started = time.monotonic()
    try:
        return grade()
    except RubricError as exc:
        write_failure(root, time.monotonic() - started)
        return usage_error(f"the {rubric_owner} rubric: {exc}")
    except Exception:  # noqa: BLE001 - the platform still gets results; the staff the traceback
        traceback.print_exc()
        write_failure(root, time.monotonic() - started)
        return EXIT_INVALID
