"""``moco-ref demo``: grade the bundled example submissions and compare every verdict with the
one their manifest expects. Exit 0 iff every verdict is the expected one."""

from __future__ import annotations

import argparse
import sys

from moco_ref.cli.isolation import isolation_refusal
from moco_ref.cli.options import EXIT_BELOW, EXIT_OK, add_running_flags, options_from, usage_error
from moco_ref.cli.tables import print_table


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="grade the bundled example submissions and compare with their expected verdicts",
        description="Grade every example submission listed in the examples manifest and "
        "check each verdict against the expected one. Exit 0 iff all are as expected.",
    )
    parser.add_argument("--manifest", metavar="FILE", help="another manifest.json to use")
    parser.add_argument("--json", action="store_true", help="print JSON to stdout, no table")
    parser.add_argument(
        "--verbose", action="store_true", help="also print every example's full report"
    )
    add_running_flags(parser)
    parser.set_defaults(run=run_demo_command)


def run_demo_command(args: argparse.Namespace) -> int:
    from moco_ref.report.formats import print_reports
    from moco_ref.report.text import dumps_strict
    from moco_ref.run.demo import (
        DemoError,
        find_manifest,
        load_manifest,
        run_demo,
        scoreboard_rows,
        surprise_details,
    )

    try:
        options = options_from(args)
    except ValueError as exc:
        return usage_error(str(exc))
    if args.jobs < 1:
        return usage_error(f"--jobs must be ≥ 1, not {args.jobs}")
    try:
        manifest = find_manifest(args.manifest)
        examples = load_manifest(manifest)
    except DemoError as exc:
        return usage_error(str(exc))
    refusal = isolation_refusal(args.isolation)
    if refusal:
        return usage_error(refusal)
    if not args.json:
        print(f"grading {len(examples)} example submissions from {manifest} "
              f"({args.jobs} at a time)", file=sys.stderr, flush=True)
    outcomes = run_demo(examples, options, jobs=args.jobs, isolation=args.isolation)
    all_expected = all(outcome.as_expected for outcome in outcomes)
    rows = scoreboard_rows(outcomes, manifest.parent)
    if args.json:
        print(dumps_strict({
            "manifest": str(manifest),
            "all_as_expected": all_expected,
            "examples": [
                {"example": row[0], "bug": row[1], "expected": row[2], "actual": row[3],
                 "as_expected": outcome.as_expected, "report": outcome.report.to_dict()}
                for row, outcome in zip(rows, outcomes, strict=True)
            ],
        }))
        return EXIT_OK if all_expected else EXIT_BELOW
    if args.verbose:
        print_reports([outcome.report for outcome in outcomes], options)
    _print_scoreboard(rows)
    for outcome in outcomes:
        if not outcome.as_expected:
            print("\n".join(surprise_details(outcome)))
    matched = sum(outcome.as_expected for outcome in outcomes)
    print(f"{matched}/{len(outcomes)} verdicts as expected")
    return EXIT_OK if all_expected else EXIT_BELOW


def _print_scoreboard(rows: list[tuple[str, ...]]) -> None:
    styles = ["green" if row[-1] == "as expected" else "bold red" for row in rows]
    print_table("moco-ref demo: example submissions",
                ("example", "bug", "expected", "actual", "verdict"), rows,
                no_wrap=("verdict",), styles=styles)
