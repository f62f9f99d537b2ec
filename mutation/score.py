"""Score a finished ``mutmut run`` against the reviewed list of equivalent mutants.

Run from the project root after ``mutmut run``; ``tox -e mutation`` does both. Prints the
surviving mutants that are not listed as equivalent (with their changed line), then one
final line::

    mutation score: X% (killed K of N non-equivalent)

Exit status 1 when the score is below the target, when the run is incomplete, or when an
equivalents entry is stale (its mutant is gone, changed, or now killed).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections import Counter
from pathlib import Path

from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
from mutmut.utils.file_utils import walk_mutatable_files

DETECTED = {"killed", "timeout", "segfault", "caught by type check"}
UNDETECTED = {"survived", "no tests", "suspicious"}
DEFAULT_EQUIVALENTS = Path(__file__).with_name("equivalents.toml")


def load_statuses() -> dict[str, tuple[str, Path]]:
    """Every mutant's status and the source file it belongs to."""
    statuses = {}
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, exit_code in data.exit_code_by_key.items():
            statuses[name] = (status_by_exit_code[exit_code], path)
    return statuses


def changed_lines(name: str, path: Path) -> list[str]:
    """The mutant's added lines, stripped (what the mutation wrote)."""
    diff = get_diff_for_mutant(name, path=path)
    return [line[1:].strip() for line in diff.splitlines()
            if line.startswith("+") and not line.startswith("+++")]


def load_equivalents(path: Path) -> dict[str, dict[str, str]]:
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("equivalent", [])
    by_name = {}
    for index, entry in enumerate(entries):
        missing = {"mutant", "changed", "reason"} - set(entry)
        if missing:
            raise SystemExit(f"{path}: entry {index} lacks {sorted(missing)}")
        if entry["mutant"] in by_name:
            raise SystemExit(f"{path}: {entry['mutant']} is listed twice")
        by_name[entry["mutant"]] = entry
    return by_name


def stale_entries(equivalents: dict[str, dict[str, str]],
                  statuses: dict[str, tuple[str, Path]]) -> list[str]:
    """Entries that no longer describe a surviving mutant with the recorded change."""
    problems = []
    for name, entry in equivalents.items():
        if name not in statuses:
            problems.append(f"stale equivalent: {name} no longer exists")
            continue
        status, path = statuses[name]
        if entry["changed"].strip() not in changed_lines(name, path):
            problems.append(f"stale equivalent: {name} no longer changes "
                            f"{entry['changed']!r} (mutants were renumbered?)")
        elif status in DETECTED:
            problems.append(f"stale equivalent: {name} is now {status}; delete its entry")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--equivalents", type=Path, default=DEFAULT_EQUIVALENTS)
    parser.add_argument("--target", type=float, default=95.0, help="minimum score in percent")
    args = parser.parse_args(argv)

    statuses = load_statuses()
    equivalents = load_equivalents(args.equivalents)
    problems = stale_entries(equivalents, statuses)
    counts = Counter(status for status, _ in statuses.values())
    unchecked = counts.get("not checked", 0)
    if unchecked or not statuses:
        problems.append(f"incomplete run: {unchecked} of {len(statuses)} mutants not checked")

    scored = {name: status for name, (status, _) in statuses.items() if name not in equivalents}
    killed = sum(status in DETECTED for status in scored.values())
    for name, status in sorted(scored.items()):
        if status in UNDETECTED:
            change = " | ".join(changed_lines(name, statuses[name][1]))
            print(f"{status}: {name}  + {change}")
    for problem in problems:
        print(problem)
    score = 100.0 * killed / len(scored) if scored else 0.0
    print(f"mutation score: {score:.1f}% (killed {killed} of {len(scored)} non-equivalent)")
    return 0 if score >= args.target and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
