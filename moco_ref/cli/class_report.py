"""The ``class-report`` subcommand: what a graded batch says about the class.

``moco-ref class-report OUT [--html FILE] [--json FILE]`` reads the batch output folder OUT
of ``moco-ref grade`` (``summary.json`` and the per-submission reports) and prints the score
distribution, the invariant families students broke, the most common misconceptions and the
submissions not gradable or out of time; ``--html`` / ``--json`` also write them to FILE.
Exit 0, or 2 when OUT cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "class-report",
        help="a class's scores, broken invariants and common misconceptions from a graded batch",
        description="Read a batch output folder of `moco-ref grade` (summary.json and the "
        "per-submission reports) and report the score histogram, how many students broke "
        "each invariant family, the most common misconceptions and the submissions not "
        "gradable or timed out.",
    )
    parser.add_argument("out", metavar="OUT", help="the --out folder of `moco-ref grade`")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.set_defaults(run=run_class_report)


def run_class_report(args: argparse.Namespace) -> int:
    from moco_ref.report.class_report import ClassReportError, class_report, class_report_html
    from moco_ref.report.scoring import points_str
    from moco_ref.report.text import dumps_strict, shown_name

    try:
        data = class_report(args.out)
    except ClassReportError as exc:  # it may name a student's report file
        print(f"moco-ref: error: {shown_name(exc, cap=4096)}", file=sys.stderr)
        return 2
    scores = data["scores"]
    print(f"{data['submissions']} submission(s), {data['gradable']} gradable, "
          f"{scores['full_marks']} with full marks"
          + (f"; mean {points_str(scores['mean'])}, median {points_str(scores['median'])}"
             if scores["mean"] is not None else ""))
    print("scores (% of the maximum): " + ", ".join(
        f"{b['from_percent']:g}–{b['to_percent']:g}: {b['count']}"
        for b in scores["histogram"] if b["count"]))
    lacking = _lacking(args.out, data)
    if lacking:
        print(lacking)
    missing = set(data.get("missing_reports") or ())
    for family in data["families"]:
        if missing and len(missing) == data["submissions"]:  # no report to count from
            broken = "broken by ? (no reports)"
        elif missing:
            broken = f"broken by at least {family['broken']}"
        else:
            broken = f"broken by {family['broken']}"
        print(f"  {shown_name(family['family']):<9} {broken}, not passed by "
              f"{family['not_passed']}")
    if data["misconceptions"]:
        print("most common misconceptions:")
        for entry in data["misconceptions"][:10]:
            print(f"  {entry['count']:>3} × {shown_name(entry['misconception'], 2_000)} "
                  f"(e.g. {shown_name(entry['example'])})")
    for title, key in (("not gradable", "not_gradable"), ("timed out", "timeouts")):
        if data[key]:
            print(f"{title}: {', '.join(shown_name(name) for name in data[key])}")
    if args.json:
        Path(args.json).write_text(dumps_strict(data) + "\n", encoding="utf-8")
        print(f"JSON written to {args.json}")
    if args.html:
        Path(args.html).write_text(class_report_html(data), encoding="utf-8")
        print(f"HTML written to {args.html}")
    return 0


def _lacking(out, data: dict) -> str:
    """What the folder lacks for the families broken and the misconceptions, in words: the
    per-submission reports they are counted from (a merged output, ``grade --merge``, holds
    the summaries only; its ``merged_from`` folders have the reports). Empty when none is
    missing."""
    import json

    from moco_ref.report.text import shown_name

    missing = data.get("missing_reports") or []
    if not missing:
        return ""
    try:
        summary = json.loads((Path(out) / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = {}
    sources = summary.get("merged_from") if isinstance(summary, dict) else None
    sources = [str(place) for place in sources] if isinstance(sources, list) else []
    whose = (f"all {len(missing)}" if len(missing) == data["submissions"]
             else f"{len(missing)} of {data['submissions']}")
    text = (f"note: {whose} submission(s) have no report in this folder, so the families "
            "they broke and their misconceptions are not counted (only which families they "
            "did not pass, from summary.json)")
    if sources:
        text += (": it is a merged output (`grade --merge` keeps the summaries, not the "
                 "reports); run class-report on the folders it merged ("
                 + ", ".join(shown_name(place, cap=4096) for place in sources)
                 + ") or copy their reports into it")
    return text
