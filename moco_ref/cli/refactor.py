"""``moco-ref record PATH --out run.json`` and ``moco-ref compare A.json B.json``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_SHOWN_CHARS = 4096  # a verdict line of compare at most


def add_parsers(subparsers) -> None:
    record = subparsers.add_parser(
        "record", help="run a submission on the grader's fixed probe and save its trajectory")
    record.add_argument("target", help="a .py file, a notebook or a module path")
    record.add_argument("--out", required=True, type=Path, help="trajectory JSON to write")
    record.add_argument("--style", choices=("lab", "components", "builder"), default=None)
    record.add_argument("--seed", type=int, default=0)
    record.add_argument("--timeout", type=float, default=120.0)
    record.set_defaults(run=run_record)
    compare = subparsers.add_parser(
        "compare", help="name the first step where two recorded trajectories differ")
    compare.add_argument("a", type=Path)
    compare.add_argument("b", type=Path)
    compare.add_argument("--rtol", type=float, default=None,
                         help="compare trajectories within this tolerance instead of judging "
                              "each step's transition")
    compare.add_argument("--atol", type=float, default=None)
    compare.add_argument("--plot", type=Path, default=None, metavar="PNG",
                         help="draw the per-step relative difference of each quantity, the "
                              "float32 rounding band and the first behaviour change")
    compare.add_argument("--bitwise", action="store_true",
                         help="any difference at all is a change (exit 1), rounding included")
    compare.set_defaults(run=run_compare)


def run_record(args: argparse.Namespace) -> int:
    from moco_ref.judge.untrusted import clean_text
    from moco_ref.probe.options import GradeOptions
    from moco_ref.run.pipeline import observe_sandboxed
    from moco_ref.run.targets import TargetError, expand_targets
    from moco_ref.tools import refactor_guard

    try:
        expand_targets([args.target])
    except TargetError as exc:
        print(f"moco-ref: error: {exc}", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print(f"moco-ref: error: --timeout must be > 0, not {args.timeout:g}", file=sys.stderr)
        return 2
    options = GradeOptions(style=args.style, seed=args.seed, timeout=args.timeout)
    record = observe_sandboxed(args.target, options)
    if not record.get("gradable") or record.get("missing"):
        why = record.get("traceback") or "; ".join(
            f"{part}: {reason}" for part, reason in record.get("missing", {}).items())
        print(f"moco-ref record: {args.target} could not be observed:\n{clean_text(why)}",
              file=sys.stderr)
        return 1
    trajectory = refactor_guard.trajectory_from_observations(
        record["observations"], record["style"], args.target)
    refactor_guard.save(trajectory, args.out)
    steps = len(trajectory.get("steps", []))
    print(f"recorded {args.target} ({record['style']}"
          + (f", {steps} steps" if steps else "") + f") to {args.out}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    """What it prints of the two files (styles, laws, rules, values) is shown as
    ``text.shown_name`` shows names: the files may come from anyone."""
    from moco_ref.cli.options import usage_error
    from moco_ref.report.text import shown_name
    from moco_ref.tools import refactor_guard

    try:
        a, b = refactor_guard.load(args.a), refactor_guard.load(args.b)
        verdict = refactor_guard.classify(a, b) if "steps" in a and "steps" in b else None
        if args.plot is not None and verdict is not None:
            from moco_ref.tools.divergence_figure import save_divergence_figure

            figure = save_divergence_figure(a, b, verdict, args.plot)
            print(f"figure written to {shown_name(figure, cap=4096)}")
        if args.rtol is None and args.atol is None and not args.bitwise:
            verdict = verdict or refactor_guard.classify(a, b)
            print(shown_name(verdict, cap=_SHOWN_CHARS))
            return 1 if verdict.kind == "behaviour" else 0
        rtol, atol = args.rtol or 0.0, args.atol or 0.0
        divergence = refactor_guard.compare(a, b, rtol=rtol, atol=atol)
    except (ValueError, KeyError) as error:  # one line, the usage exit code
        return usage_error(f"compare: {error}")
    tolerance = "bitwise" if rtol == atol == 0 else f"rtol {rtol:g}, atol {atol:g}"
    if divergence is None:
        print(f"identical within tolerance ({tolerance})")
        return 0
    print(shown_name(f"{divergence} ({tolerance})", cap=_SHOWN_CHARS))
    return 1
