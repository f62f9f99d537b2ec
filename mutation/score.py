"""Score a finished ``mutmut run`` against the reviewed list of equivalent mutants.

Run from the project root after ``mutmut run``; ``tox -e mutation`` does both. Prints the
surviving mutants that are not listed as equivalent (with the line each one writes), then
one final line::

    mutation score: X% (killed K of N non-equivalent)

Exit status 1 when the score is below the target, when the run is incomplete, or when an
equivalents entry is stale (its mutant is gone, writes another line, or is now killed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import tomllib

DETECTED = {"killed", "timeout", "segfault", "caught by type check"}
UNDETECTED = {"survived", "no tests", "suspicious"}
DEFAULT_EQUIVALENTS = Path(__file__).with_name("equivalents.toml")

ChangedLines = Callable[[str], list[str]]


def load_equivalents(path: Path) -> dict[str, dict[str, str]]:
    """``{mutant name: entry}``; each entry has ``mutant``, ``changed`` and ``reason``."""
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("equivalent", [])
    by_name = {}
    for index, entry in enumerate(entries):
        missing = {"mutant", "changed", "reason"} - set(entry)
        if missing:
            raise ValueError(f"{path}: entry {index} lacks {sorted(missing)}")
        if entry["mutant"] in by_name:
            raise ValueError(f"{path}: {entry['mutant']} is listed twice")
        by_name[entry["mutant"]] = entry
    return by_name


def report(statuses: Mapping[str, str], equivalents: Mapping[str, Mapping[str, str]],
           changed_lines: ChangedLines, target: float) -> tuple[list[str], bool]:
    """The report's lines (the score last) and whether the run meets the target."""
    lines, problems = [], []
    for name, entry in equivalents.items():
        if name not in statuses:
            problems.append(f"stale equivalent: {name} no longer exists")
        elif entry["changed"].strip() not in changed_lines(name):
            problems.append(f"stale equivalent: {name} no longer writes {entry['changed']!r} "
                            "(renumbered?)")
        elif statuses[name] in DETECTED:
            problems.append(f"stale equivalent: {name} is now {statuses[name]}; delete its entry")
    unchecked = sum(status == "not checked" for status in statuses.values())
    if unchecked or not statuses:
        problems.append(f"incomplete run: {unchecked} of {len(statuses)} mutants not checked")

    scored = {name: status for name, status in statuses.items() if name not in equivalents}
    killed = sum(status in DETECTED for status in scored.values())
    for name, status in sorted(scored.items()):
        if status in UNDETECTED:
            lines.append(f"{status}: {name}  + {' | '.join(changed_lines(name))}")
    score = 100.0 * killed / len(scored) if scored else 0.0
    lines += problems
    lines.append(f"mutation score: {score:.1f}% (killed {killed} of {len(scored)} non-equivalent)")
    return lines, score >= target and not problems


def _mutmut_statuses() -> tuple[dict[str, str], ChangedLines]:
    """Every mutant's status from mutmut's result files, and its added lines."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import walk_mutatable_files

    statuses, paths = {}, {}
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, exit_code in data.exit_code_by_key.items():
            statuses[name], paths[name] = status_by_exit_code[exit_code], path

    def changed_lines(name: str) -> list[str]:
        diff = get_diff_for_mutant(name, path=paths[name])
        return [line[1:].strip() for line in diff.splitlines()
                if line.startswith("+") and not line.startswith("+++")]

    return statuses, changed_lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--equivalents", type=Path, default=DEFAULT_EQUIVALENTS)
    parser.add_argument("--target", type=float, default=95.0, help="minimum score in percent")
    args = parser.parse_args(argv)
    statuses, changed_lines = _mutmut_statuses()
    lines, passed = report(statuses, load_equivalents(args.equivalents), changed_lines,
                           args.target)
    print("\n".join(lines))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
