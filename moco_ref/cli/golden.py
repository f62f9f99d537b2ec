"""``moco-ref golden check|update``."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("golden", help="check or update the golden values")
    actions = parser.add_subparsers(dest="action", required=True)
    check = actions.add_parser("check", help="recompute every golden; exit 1 if any differs")
    update = actions.add_parser("update", help="rewrite goldens, show the diff, record why")
    update.add_argument("--reason", required=True, help="why the goldens change (recorded)")
    for action in (check, update):
        action.add_argument("--dir", type=Path, default=None, help="golden directory")
        action.add_argument("names", nargs="*", help="goldens to process (default: all)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from moco_ref.tools import golden

    directory = args.dir or golden.DEFAULT_DIR
    names = args.names or None
    if args.action == "check":
        problems = golden.check(directory, names)
        for line in problems:
            print(line)
        checked = names or sorted(golden.GOLDENS)
        print(f"{len(checked)} goldens checked in {directory}: "
              + ("all hold" if not problems else f"{len(problems)} problems"))
        return 1 if problems else 0
    diff = golden.update(args.reason, directory, names)
    print("\n".join(diff) if diff else "no golden value changed")
    return 0
