"""``moco-ref demo``: grade the bundled example submissions and compare every verdict with the
one their manifest expects. Exit 0 iff every verdict is the expected one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moco_ref.cli.isolation import isolation_refusal
from moco_ref.cli.options import EXIT_BELOW, EXIT_OK, add_running_flags, options_from, usage_error

SHOWN_IN_FULL = 2  # bugs the default demo shows as `moco-ref grade` shows a failure
SHOWN_FIRST = ("I4", "I9")  # MoCo's own laws (the mask, the batch not its own negatives) first
BOARD_FILE = "scoreboard.txt"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="grade a representative set of the bundled example submissions (--all: every "
             "one) and compare with their expected verdicts",
        description="Grade example submissions listed in the examples manifest and check "
        "each verdict against the expected one: by default one correct example per style and "
        "one bug per invariant, --all every example (a --manifest of your own: all of it). "
        "One line per example, two bugs shown in full, the whole scoreboard to a file. Exit 0 "
        "iff all are as expected.",
    )
    parser.add_argument("--manifest", metavar="FILE", help="another manifest.json to use")
    parser.add_argument("--all", action="store_true",
                        help="grade every example of the bundled manifest")
    parser.add_argument("--board", metavar="DIR", default="moco-ref-demo",
                        help=f"where the full scoreboard goes ({BOARD_FILE}; default "
                             "./moco-ref-demo)")
    parser.add_argument("--write", action="append", default=[], metavar="NAME",
                        help="also write each example's report with this writer of grade "
                             "--write (e.g. feedback-html, gradescope) into --board; "
                             "repeatable")
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
        representative,
        run_demo,
        scoreboard_rows,
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
    from moco_ref.platforms import writers

    table = writers()
    unknown = [name for name in args.write if name not in table]
    if unknown:
        return usage_error(f"--write {unknown[0]}: no such output (outputs: {', '.join(table)})")
    refusal = isolation_refusal(args.isolation)
    if refusal:
        return usage_error(refusal)
    chosen = examples if args.all or args.manifest else (representative(examples) or examples)
    if not args.json:
        what = ("one correct per style, one bug per invariant; --all grades every one"
                if len(chosen) < len(examples) else "all of them")
        from moco_ref.report.formats import report_width

        print("\n".join(_wrap(f"grading {len(chosen)} of {len(examples)} example submissions "
                              f"({what}), {args.jobs} at a time", report_width())),
              file=sys.stderr, flush=True)
    progress = _progress(len(chosen), quiet=args.json)
    outcomes = run_demo(chosen, options, jobs=args.jobs, isolation=args.isolation,
                        on_report=progress.advance)
    progress.stop()
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
    board = _write_board(rows, Path(args.board))
    _write_reports(outcomes, [table[name] for name in args.write], options, Path(args.board))
    for line in demo_lines(outcomes, rows, options, board, every=len(chosen) <= MAX_BOARD):
        print(line)
    return EXIT_OK if all_expected else EXIT_BELOW


def _write_reports(outcomes, chosen_writers, options, folder: Path) -> None:
    """Each example's files in ``folder``, named after the example (``bug_no_mask.py`` →
    ``bug_no_mask<suffix>``)."""
    from moco_ref.report.writers import Writing

    if not chosen_writers:
        return
    folder.mkdir(parents=True, exist_ok=True)
    for outcome in outcomes:
        for writer in chosen_writers:
            (folder / writer.own_name(outcome.report)).write_text(
                writer.render(outcome.report, Writing(options)), encoding="utf-8")


MAX_BOARD = 40  # more examples than this (--all): only the unexpected ones get a line


def demo_lines(outcomes, rows, options, board: Path | None, *, every: bool = True,
               width: int | None = None) -> list[str]:
    """The terminal's demo: a line per example (or, for a long run, per unexpected one), a
    few bugs shown in full as ``moco-ref grade`` shows them, the details of any surprise, and
    the closing line naming the file that holds the whole scoreboard."""
    from moco_ref.report.formats import report_width
    from moco_ref.run.demo import board_line, surprise_details

    width = width or report_width()
    names = [row[0] for row in rows]
    name_width = min(max((len(n) for n in names), default=10), max(16, width - 44))
    lines: list[str] = []
    for outcome, name in zip(outcomes, names, strict=True):
        if every or not outcome.as_expected:
            lines += board_line(outcome, name, width, name_width)
    shown = sorted((o for o in outcomes if o.as_expected
                    and o.example.expected_failed_families),
                   key=lambda o: SHOWN_FIRST.index(o.example.expected_failed_families[0])
                   if o.example.expected_failed_families[0] in SHOWN_FIRST else len(SHOWN_FIRST))
    if every and shown:
        lines += ["", f"How moco-ref explains a bug ({min(SHOWN_IN_FULL, len(shown))} of "
                  f"{len(shown)}; `moco-ref grade FILE` shows any):"]
        for outcome in shown[:SHOWN_IN_FULL]:
            lines += [""] + failure_lines(outcome.report, options, width)
    for outcome in outcomes:
        if not outcome.as_expected:
            lines += [""] + [wrapped for line in surprise_details(outcome)
                             for wrapped in _wrap(line, width)]
    matched = sum(outcome.as_expected for outcome in outcomes)
    closing = f"{matched}/{len(outcomes)} verdicts as expected"
    if board is not None:
        lines += [""] if lines and lines[-1] else []
        lines += _wrap(f"{closing}; the whole scoreboard: {board}", width)
    else:
        lines.append(closing)
    return lines


def failure_lines(report, options, width: int) -> list[str]:
    """A report's first failed check as ``moco-ref grade`` shows it: the check, its
    misconception and evidence (wrapped, whole), the command that reruns it."""
    from moco_ref.judge.results import Status
    from moco_ref.report.formats import command_lines
    from moco_ref.report.scoring import rerun_command
    from moco_ref.report.text import shown_name

    failed = next((r for r in report.results if r.status is Status.FAILED), None)
    if failed is None:
        return []
    name = shown_name(Path(report.submission).name)
    lines = _wrap(f"{name} — {failed.check_id} failed:", width)
    for paragraph in failed.message.splitlines():
        lines += _wrap(paragraph, width, "  ")
    lines += command_lines(rerun_command(report.submission, failed.check_id, options), width)
    return lines


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False, break_long_words=False) or [""]


def _write_board(rows: list[tuple[str, ...]], folder: Path) -> Path | None:
    """Every example's row (example, bug, expected, actual, verdict) as a tab-separated
    file; None when it cannot be written (the terminal still has the verdicts)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / BOARD_FILE
        lines = ["\t".join(("example", "bug", "expected", "actual", "verdict"))]
        lines += ["\t".join(" ".join(cell.split()) for cell in row) for row in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path
    except OSError:
        return None


class _progress:
    """The demo's progress on stderr (``run.progress.Progress``), per example graded."""

    def __init__(self, total: int, *, quiet: bool) -> None:
        from moco_ref.run.progress import Progress

        self._bar = None if quiet else Progress()
        if self._bar is not None:
            self._bar.start(total)

    def advance(self, report) -> None:
        if self._bar is None:
            return
        from types import SimpleNamespace

        self._bar.advance(SimpleNamespace(report=report, cached=False, target=SimpleNamespace(
            name=Path(report.submission).name)))

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
