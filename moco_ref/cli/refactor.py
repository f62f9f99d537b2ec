"""``moco-ref record PATH --out run.json`` and ``moco-ref compare A.json B.json``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_SHOWN_CHARS = 4096  # a verdict line of compare at most
# compare's exit code by verdict: 2 is a usage error; a different starting state is neither
# a pass nor a behaviour change
VERDICT_EXIT = {"identical": 0, "rounding": 0, "behaviour": 1, "start": 3}
PROBE_ARGUMENTS = ("dim", "K", "m", "T", "mlp")


def init_kwargs_of(pairs: list[str]) -> tuple[tuple[str, object], ...]:
    """``--init-arg NAME=VALUE`` pairs (VALUE as JSON, else the string); ValueError with one
    line for a malformed one or one of the probe's own arguments."""
    import json

    found = []
    for pair in pairs:
        name, equals, raw = pair.partition("=")
        if not equals or not name.isidentifier():
            raise ValueError(f"--init-arg {pair!r}: expected NAME=VALUE")
        if name in PROBE_ARGUMENTS:
            raise ValueError(f"--init-arg {name}: the probe sets {', '.join(PROBE_ARGUMENTS)}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        found.append((name, value))
    return tuple(found)


def add_parsers(subparsers) -> None:
    record = subparsers.add_parser(
        "record", help="run a submission on the grader's fixed probe and save its trajectory")
    record.add_argument("target", help="a .py file, a notebook or a module path")
    record.add_argument("--out", required=True, type=Path, help="trajectory JSON to write")
    record.add_argument("--style", choices=("lab", "components", "builder"), default=None)
    record.add_argument("--seed", type=int, default=0)
    record.add_argument("--timeout", type=float, default=120.0)
    record.add_argument("--init-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="builder: one more keyword argument of the module's constructor "
                             "(VALUE as JSON, else a string), e.g. --init-arg "
                             "fixed_batch_size=8; never dim, K, m, T or mlp (the probe's)")
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
    try:
        init_kwargs = init_kwargs_of(args.init_arg)
    except ValueError as exc:
        print(f"moco-ref: error: {exc}", file=sys.stderr)
        return 2
    options = GradeOptions(style=args.style, seed=args.seed, timeout=args.timeout,
                           init_kwargs=init_kwargs)
    record = observe_sandboxed(args.target, options)
    if record.get("gradable") and record.get("style") == "builder" and not record.get(
            "missing"):
        pass  # a module's crash is part of its trajectory (told by compare in its terms)
    elif not record.get("gradable") or record.get("missing"):
        why = record.get("traceback") or "; ".join(
            f"{part}: {reason}" for part, reason in record.get("missing", {}).items())
        print(f"moco-ref record: {args.target} could not be observed:\n{clean_text(why)}",
              file=sys.stderr)
        return 1
    trajectory = refactor_guard.trajectory_from_observations(
        record["observations"], record["style"], args.target)
    refactor_guard.save(trajectory, args.out)
    steps = len(trajectory.get("steps", []))
    crash = trajectory.get("crash")
    told = f"; {refactor_guard.crash_text(crash)}" if crash else ""
    print(f"recorded {args.target} ({record['style']}"
          + (f", {steps} steps" if steps else "") + f"{told}) to {args.out}")
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
            return VERDICT_EXIT[verdict.kind]
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
