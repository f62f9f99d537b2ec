"""``moco-ref diff-grades OLD NEW``: whose grade changed between two gradings, and why."""

from __future__ import annotations

import argparse
from pathlib import Path

from moco_ref.cli.options import EXIT_BELOW as EXIT_CHANGED
from moco_ref.cli.options import EXIT_OK, usage_error


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "diff-grades", help="list the submissions whose grade changed between two gradings",
        description="Compare two grading outputs (folders holding summary.json, or the files) "
                    "after a rubric or grader change. Exit 0 when no grade changed, 1 when "
                    "some did, 2 for bad input.")
    parser.add_argument("old", metavar="OLD")
    parser.add_argument("new", metavar="NEW")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from moco_ref.run.gradebook import diff_grades
    from moco_ref.run.targets import TargetError

    try:
        changes = diff_grades(Path(args.old), Path(args.new))
    except TargetError as exc:
        return usage_error(str(exc))
    for change in changes:
        print(change.line())
    print(f"{len(changes)} grade(s) changed" if changes else "no grade changed")
    return EXIT_CHANGED if changes else EXIT_OK
