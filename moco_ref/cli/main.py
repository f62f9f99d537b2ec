"""The ``moco-ref`` command line. Each subcommand lives in its own module and registers
itself here with ``add_parser(subparsers)``; the parser's ``run`` default does the work."""

from __future__ import annotations

import argparse
import sys

from moco_ref import __version__
from moco_ref.cli import checks as checks_cli
from moco_ref.cli import class_report as class_report_cli
from moco_ref.cli import demo as demo_cli
from moco_ref.cli import diff_grades as diff_grades_cli
from moco_ref.cli import doctor as doctor_cli
from moco_ref.cli import export as export_cli
from moco_ref.cli import golden as golden_cli
from moco_ref.cli import grade as grading_cli
from moco_ref.cli import refactor as refactor_cli
from moco_ref.cli import rubric as rubric_cli
from moco_ref.cli import sensitivity as sensitivity_cli
from moco_ref.cli import trace as trace_cli
from moco_ref.cli import train as training_cli
from moco_ref.platforms import platforms


def _add_walk(subparsers) -> None:
    parser = subparsers.add_parser(
        "walk", help="narrate one MoCo step on a 4-slot dictionary (seed page P17)"
    )
    parser.add_argument("--order", choices=("paper", "lab"), default="paper")
    parser.add_argument("--out", default=None, help="also draw the walk as a figure (PNG)")
    parser.set_defaults(run=_run_walk)


def _run_walk(args: argparse.Namespace) -> int:
    from moco_ref.tools.walk import run_walk

    walk = run_walk(args.order)
    print(walk.text())
    if args.out:
        from moco_ref.tools.walk_figure import save_walk_figure

        print(f"figure written to {save_walk_figure(walk, args.out)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moco-ref",
        description="moco-ref: the MoCo reference implementation and the grader that holds "
        "other MoCo code to it.",
    )
    parser.add_argument("--version", action="version", version=f"moco-ref {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_walk(subparsers)
    grading_cli.add_parser(subparsers)
    demo_cli.add_parser(subparsers)
    checks_cli.add_parser(subparsers)
    doctor_cli.add_parser(subparsers)
    golden_cli.add_parser(subparsers)
    refactor_cli.add_parsers(subparsers)  # record, compare
    trace_cli.add_parsers(subparsers)  # trace record|check, revisions
    training_cli.add_parser(subparsers)
    sensitivity_cli.add_parser(subparsers)
    rubric_cli.add_parser(subparsers)
    for platform in platforms().values():  # NAME build, test, run
        platform.add_commands(subparsers)
    diff_grades_cli.add_parser(subparsers)
    class_report_cli.add_parser(subparsers)
    export_cli.add_parser(subparsers)
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``revisions … -- COMMAND`` and ``trace … -- SCRIPT``: everything after the first ``--``
    is the command to run, whatever flags it holds (its own ``--`` included)."""
    if argv and argv[0] in ("revisions", "trace") and "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, None


def main(argv: list[str] | None = None) -> int:
    argv, command = _split_command(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    if command is not None:
        args.command = command
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("moco-ref: interrupted (what was graded before is in the reports and the "
              "summary)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
