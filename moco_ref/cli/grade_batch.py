"""``moco-ref grade`` on a class: batch grading into an output folder (reports, summaries, the
cache, shards) and ``--merge`` of several output folders."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from moco_ref.cli.options import EXIT_BELOW, EXIT_OK, rubric_of, usage_error
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


def run_batch(args: argparse.Namespace, options: GradeOptions, minimum, requests=()) -> int:
    from moco_ref.cli.outputs import file_problem, write_requested
    from moco_ref.cli.tables import print_verdict_line
    from moco_ref.report.scoring import meets
    from moco_ref.report.text import dumps_strict, shown_name
    from moco_ref.report.writers import Writing
    from moco_ref.run.batch import grade_folder, summary_stem
    from moco_ref.run.output import DEFAULT_OUT
    from moco_ref.run.progress import Progress
    from moco_ref.run.targets import TargetError, parse_shard, student_label

    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        return usage_error(str(exc))
    problem = file_problem(requests, 0, batch=True)
    if problem:
        return usage_error(problem)
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
            writers=[request.writer for request in requests if request.path is None],
            on_start=progress.start, on_done=progress.advance,
            per_folder=args.per_student_folders, only=tuple(args.only), rubric=rubric,
            isolation=args.isolation,
        )
    except TargetError as exc:
        return usage_error(str(exc))
    finally:
        progress.stop()
    reports = [outcome.report for outcome in result.outcomes]
    write_requested([request for request in requests if request.path is not None], reports,
                    Writing(options, rubric))
    passed = [meets(report, minimum) for report in reports]
    stem = summary_stem(shard)
    if args.json:
        print(dumps_strict(json.loads((out / f"{stem}.json").read_text(encoding="utf-8"))))
    else:
        for line in batch_summary_lines(result):
            print(line)
        graded = sum(not outcome.cached for outcome in result.outcomes)
        import textwrap

        from moco_ref.report.formats import report_width

        print(textwrap.fill(
            f"{len(reports)} submission(s) ({graded} graded, {len(reports) - graded} from the "
            f"cache) in {result.wall_seconds:.1f} s; grades in {out}/grades.csv, each "
            f"student's report and {stem}.csv/{stem}.json in {out}/"
            + (f"; shard {args.shard} left out {result.skipped_by_shard}" if shard else ""),
            report_width(), subsequent_indent="  ", break_long_words=False,
            break_on_hyphens=False))
        names = [shown_name(student_label(outcome.target)) for outcome in result.outcomes]
        print_verdict_line([name for name, ok in zip(names, passed, strict=True) if not ok],
                           len(reports), minimum)
    return EXIT_OK if all(passed) else EXIT_BELOW


HISTOGRAM_BINS = ((100, 100, "100"), (90, 99.99, "90–99"), (75, 89.99, "75–89"),
                  (50, 74.99, "50–74"), (0, 49.99, "0–49"))
MOST_FAMILIES = 5


def batch_summary_lines(result, width: int | None = None) -> list[str]:
    """A class's grading in at most a screen: the counts by status, the scores as a
    histogram (percent of the maximum), the families failed most often; each student's
    detail is in the files, not here."""
    from collections import Counter

    from moco_ref.report.formats import report_width
    from moco_ref.report.scoring import failed_families, has_full_marks

    width = width or report_width()
    reports = [outcome.report for outcome in result.outcomes]
    refused = sum(1 for outcome in result.outcomes if getattr(outcome.target, "refused", ""))
    gradable = [r for r in reports if r.gradable]
    full = sum(has_full_marks(r) for r in gradable)
    counts = [f"{full} full marks", f"{len(gradable) - full} below",
              f"{len(reports) - len(gradable)} not gradable"]
    if refused:
        counts.append(f"of those {refused} refused before running")
    lines = [f"{len(reports)} submission(s): " + ", ".join(counts)]
    if gradable:
        percents = [100.0 * r.score / r.max_score if r.max_score else 0.0 for r in gradable]
        most = max(1, max(sum(low <= p <= high for p in percents)
                          for low, high, _ in HISTOGRAM_BINS))
        bar_room = max(5, width - 20)
        lines.append("scores (% of the maximum):")
        for low, high, label in HISTOGRAM_BINS:
            count = sum(low <= p <= high for p in percents)
            bar = "█" * (round(bar_room * count / most) if count else 0)
            lines.append(f"  {label:>6}  {bar}{' ' if bar else ''}{count}")
    inspecting = sum(1 for r in reports if r.staff_notes)
    if inspecting:
        lines.append(f"staff: {inspecting} submission(s) hold code that inspects the grader's "
                     "world (their reports' staff_notes name the lines)")
    families = Counter(family for r in gradable for family in failed_families(r))
    if families:
        shown = ", ".join(f"{family} ({count})" for family, count in families.most_common(
            MOST_FAMILIES))
        lines.append(f"failed most often: {shown}")
    return lines
