"""``moco-ref sensitivity``: grade every single-point mutant of a correct solution and report
the mutants that keep full marks — the bugs the grader would miss.

Exit codes: 0 normally; 1 when the kill rate is below ``--min-kill-rate`` (or, with it, when a
reviewed equivalent lost marks); 2 for usage errors (a missing file, a bad number, an
unreadable equivalents file) and when the unmutated solution is not at full marks.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from moco_ref.cli.options import (
    EXIT_BELOW,
    EXIT_OK,
    add_option_flags,
    options_from,
    usage_error,
)
from moco_ref.probe.options import OPTIONS

DEFAULT_EQUIVALENTS = "sensitivity_equivalents.toml"  # looked for next to the solution


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "sensitivity",
        help="grade every single-point mutant of a correct solution: which bugs are missed",
        description="Write every single-point mutant of SOLUTION (a correct solution), grade "
        "each one, and report the kill rate and the mutants that keep full marks.",
    )
    parser.add_argument("solution", metavar="SOLUTION", help="a correct solution (.py)")
    parser.add_argument("-j", "--jobs", default="2", metavar="N",
                        help="mutants graded at once (default %(default)s)")
    parser.add_argument("--equivalents", metavar="FILE",
                        help="reviewed equivalent mutants (TOML); default: "
                        f"{DEFAULT_EQUIVALENTS} next to SOLUTION, when there is one")
    parser.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    parser.add_argument("--limit", metavar="N",
                        help="grade only N mutants, spread evenly over the file")
    parser.add_argument("--mutant", dest="mutants", action="append", metavar="ID",
                        help="grade only this mutant (repeatable)")
    parser.add_argument("--list", action="store_true",
                        help="list the mutants (id and change) without grading them")
    parser.add_argument("--min-kill-rate", metavar="X",
                        help="exit 1 below this kill rate (a fraction, e.g. 0.98)")
    add_option_flags(parser, only={spec.field for spec in OPTIONS if spec.in_sensitivity})
    parser.set_defaults(run=run)


def _number(text: str | None, name: str, kind, low: float, high: float | None = None):
    """``text`` as ``kind`` within [low, high]; ``ValueError`` with one line otherwise."""
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not {'an integer' if kind is int else 'a number'}"
                         ) from None
    if not (value >= low and (high is None or value <= high)) or value != value:
        bound = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
        raise ValueError(f"{name} must be {bound}, not {text}")
    return value


def run(args: argparse.Namespace) -> int:
    from moco_ref.tools import sensitivity

    try:
        jobs = _number(args.jobs, "--jobs", int, 1)
        limit = _number(args.limit, "--limit", int, 1)
        min_kill_rate = _number(args.min_kill_rate, "--min-kill-rate", float, 0.0, 1.0)
        chosen = options_from(args)
    except ValueError as exc:
        return usage_error(str(exc))
    solution = Path(args.solution)
    if not solution.is_file():
        return usage_error(f"{solution}: no such file")
    try:
        mutant_set = sensitivity.prepare(solution, chosen.style)
        equivalents_path = args.equivalents or _default_equivalents(solution)
        equivalents = (sensitivity.load_equivalents(equivalents_path)
                       if equivalents_path else [])
    except sensitivity.SensitivityError as exc:
        return usage_error(str(exc))
    if args.list:
        for mutant in mutant_set.mutants:
            print(f"{mutant.id}\n    {mutant.description}")
        print(f"{len(mutant_set.mutants)} mutants of {', '.join(mutant_set.functions)} "
              f"({len(mutant_set.not_compiling)} more did not compile)")
        return EXIT_OK

    from moco_ref.cli.isolation import isolation_refusal

    refusal = isolation_refusal()
    if refusal:
        return usage_error(refusal)
    options = replace(chosen, style=mutant_set.style)
    total = len(sensitivity.sample(
        mutant_set.mutants if args.mutants is None else list(args.mutants), limit))
    print(f"grading {solution} unmutated, then {total} mutants ({jobs} at a time)",
          file=sys.stderr, flush=True)

    def show(done, count, outcome):
        print(sensitivity.progress_line(done, count, outcome), file=sys.stderr, flush=True)

    try:
        measurement = sensitivity.measure(
            solution, mutant_set, options, equivalents=equivalents, jobs=jobs, limit=limit,
            only=args.mutants, on_outcome=show)
    except sensitivity.SensitivityError as exc:
        return usage_error(str(exc))
    print("\n".join(sensitivity.report_lines(measurement, min_kill_rate)))
    if args.json:
        from moco_ref.report.text import dumps_strict

        payload = measurement.to_dict()
        payload["equivalents_file"] = str(equivalents_path) if equivalents_path else None
        payload["min_kill_rate"] = min_kill_rate
        Path(args.json).write_text(dumps_strict(payload) + "\n", encoding="utf-8")
        print(f"JSON report written to {args.json}")
    if min_kill_rate is None:
        return EXIT_OK
    below = measurement.kill_rate + 1e-12 < min_kill_rate
    if below:
        print(f"kill rate {measurement.kill_rate:.1%} is below --min-kill-rate "
              f"{min_kill_rate:.1%}")
    return EXIT_BELOW if below or measurement.killed_equivalents else EXIT_OK


def _default_equivalents(solution: Path) -> Path | None:
    candidate = solution.parent / DEFAULT_EQUIVALENTS
    return candidate if candidate.is_file() else None
