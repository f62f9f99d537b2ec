"""The ``grade`` and ``demo`` subcommands of ``moco-ref``.

Exit codes: 0 when every submission reaches ``--min-score`` (default: full marks) — for the
demo, when every verdict is the expected one; 1 when one does not (a submission that is not
gradable never does); 2 for usage errors (a missing path, a ``--check`` that names nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from moco_ref.observe.options import STYLES, VARIANTS, GradeOptions

EXIT_OK, EXIT_BELOW, EXIT_USAGE = 0, 1, 2


def add_parsers(subparsers) -> None:
    _add_grade(subparsers)
    _add_demo(subparsers)


# --------------------------------------------------------------------------- grade


def _add_grade(subparsers) -> None:
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
    parser.add_argument("--style", choices=STYLES, help="skip style detection")
    parser.add_argument(
        "--variant", choices=VARIANTS,
        help="builder: the loss the module must have, asymmetric (forward returns one (logits, "
             "labels) pair) or symmetric (two pairs, or a loss of two halves); detected from "
             "what forward returns when not given")
    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print JSON to stdout, no table")
    output.add_argument("--brief", action="store_true",
                        help="the summary table alone (one line per check), no details")
    output.add_argument(
        "--junit", metavar="FILE", nargs="?", const="",
        help="also write JUnit XML: to FILE (all submissions), or without FILE one file per "
        "submission in --out",
    )
    output.add_argument(
        "--prairielearn", metavar="FILE",
        help="also write PrairieLearn external-grader results to FILE (one submission)",
    )
    output.add_argument(
        "--gradescope", metavar="FILE", nargs="?", const="",
        help="also write Gradescope results.json: to FILE (one submission), or without FILE "
        "one file per submission in --out",
    )
    output.add_argument(
        "--feedback", choices=("html", "md"),
        help="also write a feedback page per student (score, each family's verdict and "
        "evidence, figures; student-safe, self-contained): in batch grading "
        "<name>.feedback.html/.md beside each report in --out, otherwise "
        "<submission stem>.feedback.html/.md in the current folder (or --feedback-out)",
    )
    output.add_argument("--feedback-out", metavar="FILE",
                        help="where the one submission's --feedback page goes")
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
    _add_run_options(parser)
    judging = parser.add_argument_group("judging")
    judging.add_argument("--temperature", type=float, default=GradeOptions.temperature,
                         help="T used to judge losses and logits (default %(default)s)")
    judging.add_argument("--expect-m", type=float, metavar="M", help="pin the momentum")
    judging.add_argument("--expect-capacity", type=int, metavar="K", help="pin the capacity")
    judging.add_argument("--expect-batch-size", type=int, metavar="B", help="pin the batch size")
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
    judging.add_argument("--seed", type=int, default=GradeOptions.seed, help="probe seed")
    judging.add_argument("--rubric", metavar="FILE",
                         help="the course's points per family or check (TOML; `moco-ref rubric "
                              "show FILE` prints them); default: every invariant family an "
                              "equal share of 100")
    parser.set_defaults(run=run_grade)


def _add_run_options(parser) -> None:
    running = parser.add_argument_group("running")
    running.add_argument(
        "--timeout",
        type=float,
        default=GradeOptions.timeout,
        metavar="S",
        help="wall-clock seconds per submission (default %(default)s)",
    )
    running.add_argument(
        "--memory-mb",
        type=int,
        default=GradeOptions.memory_mb,
        metavar="MB",
        help="memory of one submission's job, all its processes together (their proportional "
        "resident sets; default %(default)s); each process also has an address-space limit "
        "4096 MB above it (torch alone maps ~3.4 GB)",
    )
    running.add_argument(
        "--check-timeout",
        type=float,
        default=GradeOptions.check_timeout,
        metavar="S",
        help="wall-clock seconds for each observed part (moco_warmup, train_moco, each "
        "component); one that runs out reports its checks 'timeout' and the rest is observed "
        "in a fresh process (default %(default)s; 0 = only --timeout)",
    )
    running.add_argument(
        "--allow-reference-import",
        action="store_true",
        help="let submissions import moco_ref (refused by default: it would let a submission "
        "hand its work to the reference)",
    )
    running.add_argument(
        "--isolation",
        choices=("bwrap", "processes"),
        default=None,
        help="bwrap (default): each submission in a bubblewrap sandbox (its own namespaces, "
        "uid 65534 without capabilities, seccomp, nothing to read but its own files); "
        "grading is refused where it cannot run. processes: FOR TRUSTED CODE ONLY (the "
        "submission runs as you, with your files)",
    )
    running.add_argument(
        "--execute-all-cells",
        action="store_true",
        help="notebooks: run every cell, not only imports and definitions",
    )
    running.add_argument(
        "-j", "--jobs", type=int, default=2, metavar="N", help="submissions graded at once"
    )


def _options_from(args: argparse.Namespace) -> GradeOptions:
    return GradeOptions(
        style=getattr(args, "style", None),
        variant=getattr(args, "variant", None),
        temperature=getattr(args, "temperature", GradeOptions.temperature),
        expect_m=getattr(args, "expect_m", None),
        expect_capacity=getattr(args, "expect_capacity", None),
        expect_batch_size=getattr(args, "expect_batch_size", None),
        seed=getattr(args, "seed", GradeOptions.seed),
        checks=tuple(getattr(args, "checks", ())),
        execute_all_cells=args.execute_all_cells,
        timeout=args.timeout,
        memory_mb=args.memory_mb,
        check_timeout=args.check_timeout or None,
        allow_reference_import=args.allow_reference_import,
        rubric=_rubric_of(args).to_pairs() if getattr(args, "rubric", None) else (),
    )


def _apply_isolation(args: argparse.Namespace) -> None:
    if getattr(args, "isolation", None):
        from moco_ref.sandbox.client import ISOLATION_VARIABLE

        os.environ[ISOLATION_VARIABLE] = args.isolation


def warm_up() -> None:
    """Start the warm process now without waiting for it, so its torch import runs while this
    process imports the judge (torch too): on two cores the two imports overlap instead of
    adding up. ``isolation_refusal`` then waits for it (or says why it cannot start)."""
    from moco_ref.sandbox.client import current_zygote

    try:
        current_zygote(wait=False)
    except Exception:  # noqa: BLE001 - isolation_refusal says why, in one line
        return


def isolation_refusal() -> str:
    """"" when the isolation in force can run here (its warm process is started), else the
    one line that says why grading is refused."""
    from moco_ref.sandbox.client import IsolationUnavailable, current_zygote

    try:
        current_zygote()
    except IsolationUnavailable as exc:
        return (f"the sandbox cannot run here: {exc}. Untrusted code is not graded without it; "
                "for code you trust, add --isolation processes")
    except ValueError as exc:  # a bad MOCO_REF_ISOLATION
        return str(exc)
    return ""


def _usage_error(message: str) -> int:
    print(f"moco-ref: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _unknown_checks(selected: tuple[str, ...]) -> list[str]:
    """The --check values that name no check id and no family."""
    from moco_ref.judge.registry import unknown_selectors

    return unknown_selectors(selected)


def _bad_run_option(args: argparse.Namespace) -> str:
    """The first of --timeout, --check-timeout, --jobs, --memory-mb, --out that cannot be
    used, said in one line naming it; "" when all can."""
    import math

    if not (math.isfinite(args.timeout) and args.timeout > 0):
        return f"--timeout must be a number of seconds > 0, not {args.timeout:g}"
    if args.check_timeout is not None and not (math.isfinite(args.check_timeout)
                                               and args.check_timeout >= 0):
        return f"--check-timeout must be ≥ 0 seconds (0: none), not {args.check_timeout:g}"
    if args.jobs < 1:
        return f"--jobs must be ≥ 1, not {args.jobs}"
    if getattr(args, "memory_mb", 1) < 64:
        return f"--memory-mb must be at least 64, not {args.memory_mb}"
    out = getattr(args, "out", None)
    if out and Path(out).exists() and not Path(out).is_dir():
        return f"--out {out} is a file, not a folder for the reports"
    return ""


def _is_batch(args: argparse.Namespace) -> bool:
    return bool(args.out or args.shard or args.only or args.per_student_folders or any(
        Path(p).is_dir() or p.endswith(".zip") for p in args.paths))


def _run_merge(args: argparse.Namespace) -> int:
    from moco_ref.observe.loader import TargetError
    from moco_ref.report.batch import DEFAULT_OUT, write_merged
    from moco_ref.report.gradebook import merge

    if args.paths:
        return _usage_error("--merge reads output folders and grades nothing: give no PATH")
    try:
        summary, notes = merge([Path(p) for p in args.merge])
    except TargetError as exc:
        return _usage_error(str(exc))
    out = Path(args.out or DEFAULT_OUT)
    write_merged(out, summary)
    for note in notes:
        print(f"note: {note}")
    rows = summary["submissions"]
    print(f"merged {len(rows)} submission(s) from {len(args.merge)} output(s) into "
          f"{out}/summary.json, summary.csv and grades.csv")
    return EXIT_OK


def run_grade(args: argparse.Namespace) -> int:
    from moco_ref.report.scoring import MinScore

    if args.merge:
        return _run_merge(args)
    if not args.paths:
        return _usage_error("grade needs at least one PATH (or --merge OUT …)")
    try:
        minimum = MinScore.parse(args.min_score) if args.min_score is not None else MinScore()
    except ValueError as exc:
        return _usage_error(str(exc))
    bad = _bad_run_option(args)
    if bad:
        return _usage_error(bad)
    _apply_isolation(args)
    warm_up()
    from moco_ref.grade import grade_many
    from moco_ref.judge.rubric import RubricError
    from moco_ref.observe.loader import TargetError, expand_targets
    from moco_ref.report.formats import print_reports, to_json, write_gradescope, write_junit
    from moco_ref.report.scoring import meets

    try:
        options = _options_from(args)
    except RubricError as exc:
        return _usage_error(f"--rubric: {exc}")
    unknown = _unknown_checks(options.checks)
    if unknown:
        return _usage_error(f"--check {' '.join(unknown)} names no check id or family "
                            "(`moco-ref checks` lists them)")
    refusal = isolation_refusal()
    if refusal:
        return _usage_error(refusal)
    if _is_batch(args):
        return _run_batch(args, options, minimum)
    try:
        targets = expand_targets(args.paths)
    except TargetError as exc:
        return _usage_error(str(exc))
    if args.gradescope is not None and len(targets) != 1:
        return _usage_error(f"--gradescope writes one submission's results; got {len(targets)}")
    if args.prairielearn and len(targets) != 1:
        return _usage_error(f"--prairielearn writes one submission's results; got "
                            f"{len(targets)}")
    if args.feedback_out and (len(targets) != 1 or not args.feedback):
        return _usage_error("--feedback-out names the page of one submission graded with "
                            "--feedback html|md")
    if args.gradescope == "" or args.junit == "":
        return _usage_error("--gradescope/--junit without FILE write one file per submission "
                            "into --out (batch grading): give a FILE or --out DIR")

    progress = None if args.json or len(targets) == 1 else _progress_printer(len(targets))
    reports = grade_many(targets, options, jobs=args.jobs, on_report=progress)
    passed = [meets(report, minimum) for report in reports]
    if args.json:
        print(to_json(reports, options, min_score=minimum.describe(), passed=all(passed)))
    else:
        print_reports(reports, options, brief=args.brief)
        _print_summary(reports, passed, minimum)
    if args.junit:
        write_junit(reports, args.junit, options)
    rubric = _rubric_of(args)
    if args.gradescope:
        write_gradescope(reports[0], args.gradescope, options, rubric)
    if args.prairielearn:
        from moco_ref.report.lms import write_prairielearn

        write_prairielearn(reports[0], args.prairielearn, rubric)
    if args.feedback:
        _write_feedback_pages(args, reports, rubric, quiet=args.json)
    return EXIT_OK if all(passed) else EXIT_BELOW


def _write_feedback_pages(args: argparse.Namespace, reports, rubric, *, quiet: bool) -> None:
    """One page per submission: --feedback-out, else <stem>.feedback.<kind> here."""
    from moco_ref.report.feedback import feedback_name, write_feedback

    for report in reports:
        path = Path(args.feedback_out) if args.feedback_out else Path(
            feedback_name(report, args.feedback))
        write_feedback(report, path, args.feedback, rubric)
        if not quiet:
            print(f"feedback for {Path(report.submission).name} written to {path}")


def _rubric_of(args: argparse.Namespace):
    """The course's rubric, read once per command (``RubricError`` when unusable), or the
    default."""
    from moco_ref.judge.rubric import DEFAULT_RUBRIC, load_rubric

    if not getattr(args, "rubric", None):
        return DEFAULT_RUBRIC
    if getattr(args, "loaded_rubric", None) is None:
        args.loaded_rubric = load_rubric(args.rubric)
    return args.loaded_rubric


def _run_batch(args: argparse.Namespace, options: GradeOptions, minimum) -> int:
    from moco_ref.observe.loader import TargetError
    from moco_ref.report.batch import (
        DEFAULT_OUT,
        Progress,
        grade_folder,
        parse_shard,
        summary_stem,
    )
    from moco_ref.report.formats import dumps_strict, write_junit
    from moco_ref.report.scoring import meets

    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        return _usage_error(str(exc))
    if args.prairielearn:
        return _usage_error("--prairielearn writes one submission's results: grade one file")
    if args.gradescope:
        return _usage_error("in batch grading --gradescope takes no FILE: one results file per "
                            "submission goes into --out")
    if args.feedback_out:
        return _usage_error("in batch grading the --feedback pages go into --out beside the "
                            "reports: give no --feedback-out")
    out = Path(args.out or DEFAULT_OUT)
    progress = Progress()
    try:
        result = grade_folder(
            args.paths, options, out=out, jobs=args.jobs, shard=shard, force=args.force,
            gradescope=args.gradescope is not None, junit=args.junit == "",
            on_start=progress.start, on_done=progress.advance,
            per_folder=args.per_student_folders, only=tuple(args.only), rubric=_rubric_of(args),
            feedback=args.feedback,
        )
    except TargetError as exc:
        return _usage_error(str(exc))
    finally:
        progress.stop()
    reports = [outcome.report for outcome in result.outcomes]
    if args.junit:
        write_junit(reports, args.junit, options)
    passed = [meets(report, minimum) for report in reports]
    stem = summary_stem(shard)
    if args.json:
        print(dumps_strict(json.loads((out / f"{stem}.json").read_text(encoding="utf-8"))))
    else:
        _print_batch_table(result)
        graded = sum(not outcome.cached for outcome in result.outcomes)
        print(f"{len(reports)} submission(s) ({graded} graded, {len(reports) - graded} from the "
              f"cache) in {result.wall_seconds:.1f} s; reports and {stem}.csv/{stem}.json in "
              f"{out}/" + (f"; shard {args.shard} left out {result.skipped_by_shard}"
                           if shard else ""))
        names = [outcome.target.name for outcome in result.outcomes]
        below = [name for name, ok in zip(names, passed, strict=True) if not ok]
        if not below:
            print(f"all {len(reports)} submission(s) reach {minimum.describe()}")
        else:
            shown = ", ".join(below[:10]) + (f" and {len(below) - 10} more"
                                             if len(below) > 10 else "")
            print(f"{len(below)} of {len(reports)} submission(s) below {minimum.describe()}: "
                  + shown)
    return EXIT_OK if all(passed) else EXIT_BELOW


def _print_batch_table(result) -> None:
    from moco_ref.report.batch import summary_rows
    from moco_ref.report.scoring import points_str

    rows = summary_rows(result.outcomes)
    cells = [(row["submission"],
              f"{points_str(row['score'])}/{points_str(row['max_score'])}" if row["gradable"]
              else "not gradable",
              ", ".join(row["failed_checks"]) or "–",
              "cached" if row["cached"] else f"{row['wall_seconds']:.1f} s") for row in rows]
    headers = ("submission", "score", "failed checks", "time")
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        for row in (headers, *cells):
            print("  ".join(row))
        return
    console = _table_console(Console)
    table = Table(title="moco-ref grade: summary")
    for header in headers:
        table.add_column(header, no_wrap=header != "failed checks")
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)


def _progress_printer(total: int):
    done = []

    def report_done(report) -> None:
        done.append(report)
        print(f"[{len(done)}/{total}] graded {report.submission}", file=sys.stderr, flush=True)

    return report_done


def _print_summary(reports, passed: list[bool], minimum) -> None:
    below = [r.submission for r, ok in zip(reports, passed, strict=True) if not ok]
    if not below:
        print(f"all {len(reports)} submission(s) reach {minimum.describe()}")
    else:
        print(f"{len(below)} of {len(reports)} submission(s) below {minimum.describe()}: "
              + ", ".join(below))


# --------------------------------------------------------------------------- demo


def _add_demo(subparsers) -> None:
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
    _add_run_options(parser)
    parser.set_defaults(run=run_demo_command)


def run_demo_command(args: argparse.Namespace) -> int:
    from moco_ref.report.demo import (
        DemoError,
        find_manifest,
        load_manifest,
        run_demo,
        scoreboard_rows,
        surprise_details,
    )
    from moco_ref.report.formats import dumps_strict, print_reports

    bad = _bad_run_option(args)
    if bad:
        return _usage_error(bad)
    _apply_isolation(args)
    try:
        manifest = find_manifest(args.manifest)
        examples = load_manifest(manifest)
    except DemoError as exc:
        return _usage_error(str(exc))
    options = _options_from(args)
    refusal = isolation_refusal()
    if refusal:
        return _usage_error(refusal)
    if not args.json:
        print(f"grading {len(examples)} example submissions from {manifest} "
              f"({args.jobs} at a time)", file=sys.stderr, flush=True)
    outcomes = run_demo(examples, options, jobs=args.jobs)
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
    headers = ("example", "bug", "expected", "actual", "verdict")
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
        for row in (headers, *rows):
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        return
    console = _table_console(Console)
    table = Table(title="moco-ref demo: example submissions")
    for header in headers:
        table.add_column(header, no_wrap=header in ("expected", "verdict"))
    for row in rows:
        style = "green" if row[-1] == "as expected" else "bold red"
        table.add_row(*(Text(cell) for cell in row[:-1]), Text(row[-1], style=style))
    console.print(table)


def _table_console(console_type):
    """A rich console for the summary tables: the terminal's width, or 160 columns when the
    output is piped, so that rows are not wrapped to 80."""
    console = console_type(highlight=False)
    return console if console.is_terminal else console_type(highlight=False, width=160)
