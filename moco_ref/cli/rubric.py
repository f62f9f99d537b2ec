"""``moco-ref rubric show [FILE]``: the points every check is worth, per style, under the
default rubric or a course's file (``moco_ref.judge.rubric``)."""

from __future__ import annotations

import argparse
import json
import sys

from moco_ref.cli.options import EXIT_OK, EXIT_USAGE
from moco_ref.probe.options import STYLES


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("rubric", help="show the points each check is worth")
    actions = parser.add_subparsers(dest="rubric_command", required=True)
    show = actions.add_parser("show", help="print the effective rubric (default or FILE)")
    show.add_argument("file", nargs="?", metavar="FILE", help="a rubric TOML file")
    show.add_argument("--style", choices=STYLES, default=None, help="only this style")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=run_show)


def run_show(args: argparse.Namespace) -> int:
    from moco_ref.judge.registry import FAMILIES, all_checks
    from moco_ref.judge.rubric import DEFAULT_RUBRIC, RubricError, load_rubric

    try:
        rubric = load_rubric(args.file) if args.file else DEFAULT_RUBRIC
    except RubricError as exc:
        print(f"moco-ref: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    styles = [args.style] if args.style else list(STYLES)
    table = {style: rubric.points(style) for style in styles}
    if args.json:
        print(json.dumps({"rubric": args.file or "default", "total": rubric.total,
                          "points": table}, indent=2))
        return EXIT_OK
    print(f"rubric: {args.file or 'default (every family weighs 1, warmup 0.5)'}")
    for style in styles:
        points = table[style]
        print(f"\n{style}: {round(sum(points.values()), 2):g} points")
        for family in FAMILIES:
            members = [s for s in all_checks(style) if s.family == family]
            if not members:
                continue
            share = sum(points[s.check_id] for s in members)
            print(f"  {family:<9} {round(share, 2):>6g}")
            for spec in members:
                print(f"    {round(points[spec.check_id], 2):>6g}  {spec.check_id}")
    return EXIT_OK
