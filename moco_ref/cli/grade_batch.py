"""``moco-ref grade`` on a class: batch grading into an output folder (reports, summaries, the
cache, shards) and ``--merge`` of several output folders."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from moco_ref.cli.options import EXIT_BELOW, EXIT_OK, rubric_of, usage_error
from moco_ref.cli.tables import print_table
from moco_ref.probe.options import GradeOptions, probe_key_of
from moco_ref.run.cache import course_probe_secret


def is_batch(args: argparse.Namespace) -> bool:
    return bool(args.out or args.shard or args.only or args.per_student_folders or any(
        Path(p).is_dir() or p.endswith(".zip") for p in args.paths))



def run_merge(args: argparse.Namespace) -> int:
    from moco_ref.report.text import shown_name
    from moco_ref.run.batch import write_merged
    from moco_ref.run.gradebook import merge
    from moco_ref.run.output import DEFAULT_OUT
    from moco_ref.run.targets import TargetError

    if args.paths:
        return usage_error("--merge reads output folders and grades nothing: give no PATH")
    try:
        summary, notes = merge([Path(p) for p in args.merge])
    except TargetError as exc:
        return usage_error(str(exc))
    out = Path(args.out or DEFAULT_OUT)
    write_merged(out, summary)
    for note in notes:
        print(f"note: {shown_name(note, cap=4096)}")
    rows = summary["submissions"]
    print(f"merged {len(rows)} submission(s) from {len(args.merge)} output(s) into "
          f"{out}/summary.json, summary.csv, grades.csv and canvas_import.csv")
    return EXIT_OK


def run_batch(args: argparse.Namespace, options: GradeOptions, minimum) -> int:
    from moco_ref.cli.tables import print_verdict_line
    from moco_ref.report.formats import write_junit
    from moco_ref.report.scoring import meets
    from moco_ref.report.text import dumps_strict, shown_name
    from moco_ref.run.batch import grade_folder, summary_stem
    from moco_ref.run.output import DEFAULT_OUT
    from moco_ref.run.progress import Progress
    from moco_ref.run.targets import TargetError, parse_shard, student_label

    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        return usage_error(str(exc))
    if args.prairielearn:
        return usage_error("--prairielearn writes one submission's results: grade one file")
    if args.gradescope:
        return usage_error("in batch grading --gradescope takes no FILE: one results file per "
                            "submission goes into --out")
    if args.feedback_out:
        return usage_error("in batch grading the --feedback pages go into --out beside the "
                            "reports: give no --feedback-out")
    out = Path(args.out or DEFAULT_OUT)
    if not options.probe_key:  # the course's own probe, kept beside its cache
        options = replace(options, probe_key=probe_key_of(course_probe_secret(out)))
    rubric = rubric_of(args)
    if getattr(args, "release_feedback", False):  # --release-feedback: the pages show it all
        rubric = replace(rubric, released=True)
    progress = Progress()
    try:
        result = grade_folder(
            args.paths, options, out=out, jobs=args.jobs, shard=shard, force=args.force,
            gradescope=args.gradescope is not None, junit=args.junit == "",
            on_start=progress.start, on_done=progress.advance,
            per_folder=args.per_student_folders, only=tuple(args.only), rubric=rubric,
            feedback=args.feedback, isolation=args.isolation,
        )
    except TargetError as exc:
        return usage_error(str(exc))
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
        names = [shown_name(student_label(outcome.target)) for outcome in result.outcomes]
        print_verdict_line([name for name, ok in zip(names, passed, strict=True) if not ok],
                           len(reports), minimum)
    return EXIT_OK if all(passed) else EXIT_BELOW


def _print_batch_table(result) -> None:
    from moco_ref.report.scoring import points_str
    from moco_ref.report.text import shown_name
    from moco_ref.run.batch import summary_rows

    rows = summary_rows(result.outcomes)
    cells = [(shown_name(row["who"]),
              f"{points_str(row['score'])}/{points_str(row['max_score'])}" if row["gradable"]
              else "not gradable",
              ", ".join(row["failed_checks"]) or "–",
              "cached" if row["cached"] else f"{row['wall_seconds']:.1f} s") for row in rows]
    print_table("moco-ref grade: summary", ("student", "score", "failed checks", "time"),
                cells, no_wrap=("score", "time"))
