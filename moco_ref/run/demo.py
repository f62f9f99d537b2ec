"""``moco-ref demo``: grade the bundled example submissions and compare every verdict with the
one their manifest expects (correct variants get full marks; each buggy one fails exactly the
families its bug breaks, and no other).

The manifest is looked for, in order, at ``moco_ref/examples/submissions/manifest.json``
(inside the installed package, where a regular ``pip install .`` would carry it), at
``<repository>/examples/submissions/manifest.json`` (a source checkout or an editable
install) and at ``./examples/submissions/manifest.json``; ``--manifest`` names another one.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import moco_ref
from moco_ref.judge.results import SubmissionReport
from moco_ref.probe.options import GradeOptions
from moco_ref.report.formats import score_text
from moco_ref.report.scoring import NOT_PASSED, failed_families, has_full_marks, told_elsewhere
from moco_ref.report.text import shown_name
from moco_ref.run.pipeline import grade_tasks

MANIFEST_RELATIVE = Path("examples") / "submissions" / "manifest.json"


class DemoError(RuntimeError):
    """No usable manifest: a setup problem, reported as a usage error."""


@dataclass(frozen=True)
class Example:
    path: Path
    style: str | None
    expect_full_marks: bool
    expected_failed_families: tuple[str, ...]
    bug: str = ""
    expect_gradable: bool = True
    options: tuple[tuple[str, object], ...] = ()  # GradeOptions overrides (e.g. a short timeout)
    not_passed_status: str | None = None  # every check that does not pass has this status
    points_lost_at_least: float | None = None  # tampering must not earn more than the honest run

    @property
    def expected_text(self) -> str:
        if not self.expect_gradable:
            return "not gradable"
        if self.expect_full_marks:
            return "full marks"
        return "fails " + (", ".join(self.expected_failed_families) or "some check")


@dataclass
class DemoOutcome:
    example: Example
    report: SubmissionReport

    @property
    def as_expected(self) -> bool:
        example, report = self.example, self.report
        if not example.expect_gradable:
            return not report.gradable
        if example.expect_full_marks:
            return has_full_marks(report)
        failed = failed_families(report)
        if not report.gradable or not failed:
            return False
        if example.points_lost_at_least is not None and \
                report.max_score - report.score < example.points_lost_at_least - 1e-9:
            return False
        if example.not_passed_status is not None and any(
            result.status.value != example.not_passed_status
            for result in report.results
            if result.status in NOT_PASSED and not told_elsewhere(result)
        ):
            return False
        expected = set(example.expected_failed_families)
        return not expected or set(failed) == expected

    @property
    def actual_text(self) -> str:
        if not self.report.gradable:
            return "not gradable"
        failed = failed_families(self.report)
        verdict = "fails " + ", ".join(failed) if failed else "full marks"
        return f"{verdict} ({score_text(self.report)})"


def manifest_candidates() -> list[Path]:
    """Inside the package, beside it (a source checkout), then under the current folder."""
    package = Path(moco_ref.__file__).resolve().parent
    candidates = [package / MANIFEST_RELATIVE, package.parent / MANIFEST_RELATIVE]
    here = Path.cwd() / MANIFEST_RELATIVE
    return candidates + ([here] if here not in candidates else [])


def find_manifest(explicit: str | Path | None = None) -> Path:
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise DemoError(f"no manifest at {path}")
        return path
    for candidate in manifest_candidates():
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(candidate) for candidate in manifest_candidates())
    raise DemoError(
        f"no example manifest found (looked at {looked}); run from a source checkout or "
        "pass --manifest PATH"
    )


def load_manifest(path: Path) -> list[Example]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data["submissions"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DemoError(f"{path} is not a manifest with a 'submissions' list: {exc}") from exc
    examples = []
    for index, entry in enumerate(entries):
        try:
            examples.append(
                Example(
                    path=(path.parent / entry["path"]).resolve(),
                    style=entry.get("style"),
                    expect_full_marks=bool(entry["expect_full_marks"]),
                    expected_failed_families=tuple(entry.get("expected_failed_families", ())),
                    bug=entry.get("bug", ""),
                    expect_gradable=bool(entry.get("expect_gradable", True)),
                    options=tuple(sorted(dict(entry.get("options") or {}).items())),
                    not_passed_status=entry.get("not_passed_status"),
                    points_lost_at_least=entry.get("points_lost_at_least"),
                )
            )
        except (KeyError, TypeError) as exc:
            raise DemoError(f"{path}: submission #{index} lacks {exc}") from exc
    if not examples:
        raise DemoError(f"{path} lists no submissions")
    missing = [str(example.path) for example in examples if not example.path.exists()]
    if missing:
        raise DemoError(f"{path} lists submissions that do not exist: {', '.join(missing)}")
    return examples


INVARIANT_FAMILIES = ("I1", "I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9")
STYLE_ORDER = ("lab", "builder", "components")


def representative(examples: list[Example]) -> list[Example]:
    """The default demo's set: the first correct example of each style, then for each
    invariant the first example whose bug breaks that invariant alone (a LAB one when there
    is one), in manifest order within each group."""
    chosen: list[Example] = []
    for style in STYLE_ORDER:
        chosen += [e for e in examples if e.style == style and e.expect_full_marks
                   and e.expect_gradable][:1]
    for family in INVARIANT_FAMILIES:
        alone = [e for e in examples if e.expected_failed_families == (family,)
                 and not e.expect_full_marks and e.expect_gradable and not e.options]
        alone.sort(key=lambda e: STYLE_ORDER.index(e.style) if e.style in STYLE_ORDER else 9)
        chosen += alone[:1]
    return chosen


def run_demo(
    examples: list[Example], options: GradeOptions, *, jobs: int = 2, on_report=None,
    isolation: str | None = None,
) -> list[DemoOutcome]:
    tasks = [
        (str(example.path), GradeOptions.from_dict(
            {**options.to_dict(), "style": example.style, **dict(example.options)}))
        for example in examples
    ]
    reports = grade_tasks(tasks, jobs=jobs, on_report=on_report, isolation=isolation)
    return [DemoOutcome(example, report) for example, report in zip(examples, reports, strict=True)]


def scoreboard_rows(outcomes: list[DemoOutcome], root: Path) -> list[tuple[str, ...]]:
    rows = []
    for outcome in outcomes:
        example = outcome.example
        try:
            name = str(example.path.resolve().relative_to(root.resolve()))
        except ValueError:
            name = str(example.path)
        rows.append(
            (
                shown_name(name, cap=4096),
                shown_name(example.bug or "correct variant"),
                example.expected_text,
                outcome.actual_text,
                "as expected" if outcome.as_expected else "UNEXPECTED",
            )
        )
    return rows


def board_line(outcome: DemoOutcome, name: str, width: int, name_width: int) -> list[str]:
    """One example on the compact scoreboard: ✓ or ✗, its name (shortened in the middle, never
    broken), what was expected and what it got; what does not fit goes on a second line."""
    mark = "✓" if outcome.as_expected else "✗"
    expected = outcome.example.expected_text
    actual = outcome.actual_text
    name = middle_ellipsis(name, name_width)
    head = f"{mark} {name:<{name_width}}  "
    return textwrap.wrap(f"{expected} → {actual}", width, initial_indent=head,
                         subsequent_indent=" " * len(head), break_on_hyphens=False,
                         break_long_words=False) or [head.rstrip()]


def middle_ellipsis(text: str, width: int) -> str:
    """``text`` whole when it fits ``width``, else its head and tail around "…"."""
    if len(text) <= width:
        return text
    keep = max(1, width - 1)
    head = (keep + 1) // 2
    return text[:head] + "…" + text[len(text) - (keep - head):]


def surprise_details(outcome: DemoOutcome) -> list[str]:
    """What to read when a verdict is not the expected one."""
    report = outcome.report
    lines = [f"{shown_name(report.submission, cap=4096)}: expected "
             f"{shown_name(outcome.example.expected_text)}, got {outcome.actual_text}"]
    if not report.gradable:
        lines += ["  " + line for line in report.traceback.rstrip().splitlines()[-15:]]
    for result in report.results:
        if result.status in NOT_PASSED:
            lines.append(f"  {result.status.value} {result.check_id} [{result.family}]: "
                         f"{result.message.splitlines()[0] if result.message else ''}")
    return lines
