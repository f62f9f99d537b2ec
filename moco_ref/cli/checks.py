"""``moco-ref checks``: every check, per style, with its points and the contract it enforces
(what staff put in a syllabus and students read before they submit)."""

from __future__ import annotations

import argparse
import json

from moco_ref.probe.options import STYLES


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "checks", help="list every check with its points, contract and how each style is judged")
    parser.add_argument("--style", choices=STYLES, default=None,
                        help="only the checks that apply to this style")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def catalogue(style: str | None = None) -> list[dict]:
    """One entry per check: id, family, title, points, contract, and per style how it is
    judged; ``not_applicable`` names the styles it never applies to, with why."""
    from moco_ref.judge.registry import all_checks, not_applicable_reason
    from moco_ref.judge.rubric import DEFAULT_RUBRIC

    points = {s: DEFAULT_RUBRIC.points(s) for s in STYLES}
    entries = []
    for spec in all_checks(style):
        styles = [style] if style else list(STYLES)
        entries.append({
            "id": spec.check_id,
            "family": spec.family,
            "title": spec.title,
            "weight": spec.points,  # within its family
            "contract": spec.contract,
            "styles": {s: {"points": points[s][spec.check_id], "how_judged": spec.how_judged(s)}
                       for s in styles if spec.applies_to(s)},
            "not_applicable": {s: not_applicable_reason(spec, s)
                               for s in styles if not spec.applies_to(s)},
        })
    return entries


def run(args: argparse.Namespace) -> int:
    entries = catalogue(args.style)
    if args.json:
        print(json.dumps({"style": args.style, "checks": entries}, indent=2, ensure_ascii=False))
        return 0
    styles = [args.style] if args.style else list(STYLES)
    for style in styles:
        applying = [e for e in entries if style in e["styles"]]
        total = sum(e["styles"][style]["points"] for e in applying)
        print(f"{style}: {len(applying)} checks, {round(total, 2):g} points (default rubric)")
    family = None
    for entry in entries:
        if entry["family"] != family:
            family = entry["family"]
            print(f"\n== {family}")
        print(f"\n{entry['id']}  {entry['title']}")
        print(f"  contract: {entry['contract']}")
        for style, info in entry["styles"].items():
            print(f"  {style} ({round(info['points'], 2):g} pt): {info['how_judged']}")
        for style, why in entry["not_applicable"].items():
            print(f"  {style}: not applicable — {why}")
    return 0
