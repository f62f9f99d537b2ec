"""``moco-ref rubric show [FILE]``: the points every check is worth, per style, under the
default rubric or a course's file (``moco_ref.judge.rubric``), with what students see of
each check (``[visibility]``) and what their feedback holds (``[output]``). For a FILE that
does not exist yet it prints a complete rubric to start from (``--example`` prints it
alone, to be written to a file: ``moco-ref rubric show --example > course.toml``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moco_ref.cli.options import EXIT_OK, EXIT_USAGE
from moco_ref.probe.options import STYLES

VISIBILITY_MEANING = {
    "visible": "shown to students at once",
    "after_due_date": "shown after the due date",
    "after_published": "shown once the grades are published",
    "hidden": "never shown to students",
}
OUTPUT_MEANING = {
    "show_submission_output": "the submission's own stdout/stderr in student feedback",
}


def example_rubric() -> str:
    """A complete rubric file: every key with its default, and an example of each table."""
    from moco_ref.judge.registry import FAMILIES
    from moco_ref.judge.rubric import DEFAULT_FAMILY_WEIGHTS, DEFAULT_TOTAL

    families = "\n".join(f"{family} = {DEFAULT_FAMILY_WEIGHTS[family]:g}"
                         for family in FAMILIES)
    return f"""\
# A moco-ref course rubric. `moco-ref rubric show FILE` prints the points it gives each
# check; `moco-ref grade --rubric FILE`, `moco-ref gradescope build --rubric FILE` and
# `moco-ref prairielearn build --rubric FILE` grade with it.

# Every submission of a style is graded out of this total.
total = {DEFAULT_TOTAL:g}

# Each invariant family's weight: a family gets weight / (the weights of the families that
# apply to the style) of the total; 0 leaves a family out of the score.
[families]
{families}

# A check's weight inside its family (default: the check's declared points); here the
# other-view positive counts 3 against the declared points of the other I8 checks.
# `moco-ref checks` lists the check ids.
[checks]
"I8-key-from-other-view" = 3

# What students see of a check or a whole family (every other check: "visible"):
#   visible          shown at once
#   after_due_date   shown after the due date
#   after_published  shown once the grades are published
#   hidden           never shown to students (its points still count)
[visibility]
I4 = "after_due_date"
"I9-batch-not-own-negative" = "hidden"

# What the students' feedback holds.
[output]
show_submission_output = false  # the submission's own stdout/stderr
"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("rubric", help="show the points each check is worth")
    actions = parser.add_subparsers(dest="rubric_command", required=True)
    show = actions.add_parser(
        "show", help="print the effective rubric (default or FILE): points, visibility and "
        "output settings; for a FILE that does not exist yet, a complete example")
    show.add_argument("file", nargs="?", metavar="FILE", help="a rubric TOML file")
    show.add_argument("--style", choices=STYLES, default=None, help="only this style")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--example", action="store_true",
                      help="print a complete rubric to start from (TOML) and nothing else")
    show.set_defaults(run=run_show)


def run_show(args: argparse.Namespace) -> int:
    from moco_ref.judge.registry import FAMILIES, all_checks
    from moco_ref.judge.rubric import DEFAULT_RUBRIC, RubricError, load_rubric

    if args.example:
        print(example_rubric(), end="")
        return EXIT_OK
    if args.file and not Path(args.file).exists():
        print(f"moco-ref: {args.file} does not exist yet; a complete rubric to start from "
              f"follows (`moco-ref rubric show --example > {args.file}` writes it)",
              file=sys.stderr)
        print(example_rubric(), end="")
        return EXIT_USAGE
    try:
        rubric = load_rubric(args.file) if args.file else DEFAULT_RUBRIC
    except RubricError as exc:
        print(f"moco-ref: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    styles = [args.style] if args.style else list(STYLES)
    table = {style: rubric.points(style) for style in styles}
    output = {"show_submission_output": rubric.show_submission_output}
    if args.json:
        print(json.dumps({
            "rubric": args.file or "default", "total": rubric.total, "points": table,
            "visibility": dict(rubric.visibility),
            "visibility_by_check": {style: {check: rubric.visibility_of(check)
                                            for check in table[style]} for style in styles},
            "output": output}, indent=2))
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
                visibility = rubric.visibility_of(spec.check_id)
                shown = "" if visibility == "visible" else f"  [{visibility}]"
                print(f"    {round(points[spec.check_id], 2):>6g}  {spec.check_id}{shown}")
    _print_settings(rubric)
    return EXIT_OK


def _print_settings(rubric) -> None:
    print("\nvisibility (what students see):")
    for name, visibility in sorted(rubric.visibility.items()):
        print(f"  {name:<27} {visibility:<16} {VISIBILITY_MEANING[visibility]}")
    rest = "every other check" if rubric.visibility else "every check"
    print(f"  {rest}: visible ({VISIBILITY_MEANING['visible']})")
    print("\noutput (what student feedback holds):")
    value = "true" if rubric.show_submission_output else "false"
    print(f"  show_submission_output = {value:<6} {OUTPUT_MEANING['show_submission_output']}")
