"""``moco-ref grade``: the command's flags and grading the submissions it names, one by one
(a folder, a zip or ``--out`` grades in batch: ``grade_batch``).

Exit codes (``cli.options``): 0 when every submission reaches ``--min-score`` (default: full
marks); 1 when one does not (a submission that is not gradable never does); 2 for usage
errors (a missing path, a ``--check`` that names nothing, a value out of range).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from moco_ref.cli.grade_batch import is_batch, run_batch, run_merge
from moco_ref.cli.isolation import isolation_refusal, warm_up
from moco_ref.cli.options import (
    EXIT_BELOW,
    EXIT_OK,
    add_option_flags,
    add_running_flags,
    options_from,
    rubric_of,
    usage_error,
)
from moco_ref.cli.outputs import add_output_flags, file_problem, requests_of, write_requested
from moco_ref.platforms import writers
from moco_ref.probe.options import probe_key_of

PROBE_SECRET_VARIABLE = "MOCO_REF_PROBE_SECRET"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "grade",
        help="grade MoCo submissions (files, notebooks, folders or module paths)",
        description="Grade MoCo submissions against the reference: each runs in its own "
        "process, is observed there, and is judged here. Exit 0 iff every score reaches "
        "--min-score.",
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH",
        help=".py, .ipynb, a folder of them, a .zip a learning platform exported, or pkg.module"
    )
    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print JSON to stdout, no table")
    output.add_argument("--brief", action="store_true",
                        help="the summary table alone (one line per check), no details")
    add_output_flags(output, writers())
    output.add_argument("--release-feedback", action="store_true",
                        help="the course has released what its rubric shows after the due "
                        "date or after publishing: the feedback pages and the PrairieLearn "
                        "results show those checks and the total (hidden checks stay out; "
                        "Gradescope releases on its own)")
    batch = parser.add_argument_group(
        "batch grading",
        "A folder PATH (or --out/--shard) grades in batch: a progress bar, one report per "
        "submission and summary.csv/summary.json in --out, a cache of unchanged submissions.",
    )
    batch.add_argument("--out", metavar="DIR",
                       help="where reports and summaries go (default: grading-reports/)")
    batch.add_argument("--shard", metavar="I/N",
                       help="grade only shard I of N (a stable hash of each submission's "
                       "relative path), e.g. for CI matrix jobs")
    batch.add_argument("--force", action="store_true",
                       help="grade again even submissions the cache in --out has seen")
    batch.add_argument("--per-student-folders", action="store_true",
                       help="each folder under PATH is one student's submission (the main file "
                            "found by its entry points, the rest helper modules); automatic "
                            "for a .zip and for Gradescope's export")
    batch.add_argument("--only", nargs="+", metavar="ID", default=(),
                       help="regrade only these submissions (name, folder or student id); the "
                            "others come from the cache in --out")
    batch.add_argument("--merge", nargs="+", metavar="OUT",
                       help="merge the summaries of these output folders (e.g. shards) into "
                            "summary.json, summary.csv and grades.csv in --out; grades nothing")
    output.add_argument(
        "--min-score",
        metavar="X",
        help="points (e.g. 90, of the rubric's total) or a percentage (e.g. 90%%) to reach; "
             "default: full marks",
    )
    add_running_flags(parser)
    judging = add_option_flags(parser, ("judging",))["judging"]
    judging.add_argument(
        "--check",
        dest="checks",
        action="extend",
        nargs="+",
        metavar="ID",
        default=[],
        help="run only this check (a whole id, e.g. I3-fifo-keeps-newest) or family (I3, "
             "contract, warmup); repeatable",
    )
    judging.add_argument("--rubric", metavar="FILE",
                         help="the course's points per family or check (TOML; `moco-ref rubric "
                              "show FILE` prints them); default: every invariant family an "
                              "equal share of 100")
    judging.add_argument("--probe-secret", metavar="FILE",
                         help="a file holding the course's probe secret (- reads it from "
                              "stdin; never the secret itself: a command line is readable by "
                              "every process of the machine): the probe's sizes, ids and seeds "
                              "are drawn from it (default: $" + PROBE_SECRET_VARIABLE + "; in "
                              "batch grading the secret kept in --out, made on first use; "
                              "otherwise the documented default probe)")
    parser.set_defaults(run=run_grade)


MAX_SECRET_BYTES = 4096


def probe_secret_of(source: str | None) -> bytes | None:
    """The course's probe secret: read from the file ``source`` names (``-``: stdin), else
    from ``$MOCO_REF_PROBE_SECRET``, else None. Never taken from the command line itself,
    which every process of the machine can read (``/proc/PID/cmdline``)."""
    if source is None:
        value = os.environ.get(PROBE_SECRET_VARIABLE)
        return value.encode() if value else None
    try:
        if source == "-":
            data = sys.stdin.buffer.read(MAX_SECRET_BYTES + 1)
        else:
            with open(source, "rb") as file:
                data = file.read(MAX_SECRET_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"--probe-secret {source!r}: no such file (the option takes a file "
                         "holding the secret, or - for stdin, never the secret itself: a "
                         "command line is readable by every process of the machine)") from None
    except OSError as exc:
        raise ValueError(f"--probe-secret: cannot read {source!r}: {exc.strerror}") from None
    if len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"--probe-secret: {source!r} holds more than {MAX_SECRET_BYTES} bytes")
    data = data.rstrip(b"\r\n")
    if not data:
        raise ValueError(f"--probe-secret: {source!r} is empty")
    return data


def run_grade(args: argparse.Namespace) -> int:
    from moco_ref.report.scoring import MinScore

    if args.merge:
        return run_merge(args)
    if not args.paths:
        return usage_error("grade needs at least one PATH (or --merge OUT …)")
    try:
        minimum = MinScore.parse(args.min_score) if args.min_score is not None else MinScore()
    except ValueError as exc:
        return usage_error(str(exc))
    if args.jobs < 1:
        return usage_error(f"--jobs must be ≥ 1, not {args.jobs}")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        return usage_error(f"--out {args.out} is a file, not a folder for the reports")
    warm_up(args.isolation)
    from moco_ref.judge.registry import unknown_selectors
    from moco_ref.judge.rubric import RubricError
    from moco_ref.report.formats import print_reports, to_json
    from moco_ref.report.scoring import meets
    from moco_ref.report.text import shown_name
    from moco_ref.report.writers import Writing
    from moco_ref.run.pipeline import grade_many
    from moco_ref.run.targets import TargetError, expand_targets

    try:
        rubric = rubric_of(args)
        options = options_from(args, checks=tuple(args.checks), rubric=rubric.to_pairs()
                               if args.rubric else ())
    except RubricError as exc:
        return usage_error(f"--rubric: {exc}")
    except ValueError as exc:
        return usage_error(str(exc))
    if args.release_feedback:  # how the feedback shows: not an option, not in the cache key
        rubric = replace(rubric, released=True)
    try:
        secret = probe_secret_of(args.probe_secret)
    except ValueError as exc:
        return usage_error(str(exc))
    if secret:
        options = replace(options, probe_key=probe_key_of(secret))
    unknown = unknown_selectors(options.checks)
    if unknown:
        return usage_error(f"--check {' '.join(unknown)} names no check id or family "
                            "(`moco-ref checks` lists them)")
    refusal = isolation_refusal(args.isolation)
    if refusal:
        return usage_error(refusal)
    try:
        requests = requests_of(args, writers())
    except ValueError as exc:
        return usage_error(str(exc))
    if is_batch(args):
        return run_batch(args, options, minimum, requests)
    try:
        targets = expand_targets(args.paths)
    except TargetError as exc:
        return usage_error(str(exc))
    problem = file_problem(requests, len(targets), batch=False)
    if problem:
        return usage_error(problem)

    progress = None if args.json or len(targets) == 1 else _progress_printer(len(targets))
    reports = grade_many(targets, options, jobs=args.jobs, on_report=progress,
                         isolation=args.isolation)
    passed = [meets(report, minimum) for report in reports]
    if args.json:
        print(to_json(reports, options, min_score=minimum.describe(), passed=all(passed)))
    else:
        print_reports(reports, options, brief=args.brief)
        _print_summary(reports, passed, minimum)
    for what, path in write_requested(requests, reports, Writing(options, rubric)):
        if not args.json:
            print(f"{shown_name(what)} written to {shown_name(path, cap=4096)}")
    return EXIT_OK if all(passed) else EXIT_BELOW


def _progress_printer(total: int):
    from moco_ref.report.text import shown_name

    done = []

    def report_done(report) -> None:
        done.append(report)
        print(f"[{len(done)}/{total}] graded {shown_name(report.submission, cap=4096)}",
              file=sys.stderr, flush=True)

    return report_done


def _print_summary(reports, passed: list[bool], minimum) -> None:
    from moco_ref.cli.tables import print_verdict_line
    from moco_ref.report.text import shown_name

    print_verdict_line([shown_name(r.submission, cap=4096)
                        for r, ok in zip(reports, passed, strict=True) if not ok],
                       len(reports), minimum)
