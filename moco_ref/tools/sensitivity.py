"""How sensitive the grader is: every single-point mutant of a correct solution
(``moco_ref.tools.mutants``) is graded, and each one that keeps full marks is a bug the grader
would miss. A mutant is *killed* when its report is short of full marks (a check failed, raised
or timed out, or the mutant was not gradable) and *survives* otherwise.

Mutants that cannot change behaviour are listed, with why, in a reviewed equivalents file
(TOML: ``[[equivalent]]`` entries with ``id``, ``file`` and ``reason``); they are left out of
the kill rate's denominator but still graded, and one that loses marks is reported, as an
error of the equivalents file or of the grader.
"""

from __future__ import annotations

import tempfile
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from moco_ref.judge.results import Status, SubmissionReport
from moco_ref.probe.options import GradeOptions
from moco_ref.report.scoring import has_full_marks
from moco_ref.tools.mutants import Mutant, MutantSet, generate

NOT_GRADABLE = "(not gradable)"
_EPSILON = 1e-9


class SensitivityError(ValueError):
    """A problem with what was asked (a file, the equivalents file) — one line to show."""


@dataclass(frozen=True)
class Equivalent:
    id: str
    file: str
    reason: str


@dataclass
class Outcome:
    mutant: Mutant
    killed: bool
    killed_by: tuple[str, ...]  # the check ids short of full marks, or NOT_GRADABLE
    equivalent: Equivalent | None = None
    score: float = 0.0
    max_score: float = 0.0
    wall_seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"id": self.mutant.id, "operator": self.mutant.operator,
                "line": self.mutant.line, "description": self.mutant.description,
                "original_line": self.mutant.original_line,
                "verdict": "killed" if self.killed else "survived",
                "equivalent": self.equivalent.reason if self.equivalent else None,
                "killed_by": list(self.killed_by), "score": self.score,
                "max_score": self.max_score, "wall_seconds": round(self.wall_seconds, 2)}


@dataclass
class Measurement:
    solution: str
    style: str
    mutants: MutantSet
    baseline: SubmissionReport
    outcomes: list[Outcome] = field(default_factory=list)
    sampled: int | None = None  # --limit: how many of the compiled mutants were graded
    stale_equivalents: list[Equivalent] = field(default_factory=list)  # match no mutant

    @property
    def scored(self) -> list[Outcome]:
        """The outcomes the kill rate counts: every graded mutant but the equivalents."""
        return [o for o in self.outcomes if o.equivalent is None]

    @property
    def killed(self) -> list[Outcome]:
        return [o for o in self.scored if o.killed]

    @property
    def survivors(self) -> list[Outcome]:
        return [o for o in self.scored if not o.killed]

    @property
    def equivalents(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.equivalent is not None]

    @property
    def killed_equivalents(self) -> list[Outcome]:
        return [o for o in self.equivalents if o.killed]

    @property
    def kill_rate(self) -> float:
        scored = self.scored
        return len(self.killed) / len(scored) if scored else 1.0

    def killers(self) -> list[tuple[str, int, int]]:
        """``(check id, mutants it killed, mutants it alone killed)``, most kills first."""
        total: Counter[str] = Counter()
        alone: Counter[str] = Counter()
        for outcome in self.killed:
            total.update(outcome.killed_by)
            if len(outcome.killed_by) == 1:
                alone.update(outcome.killed_by)
        return sorted(((check, count, alone[check]) for check, count in total.items()),
                      key=lambda row: (-row[1], row[0]))

    def to_dict(self) -> dict:
        return {
            "solution": self.solution,
            "style": self.style,
            "functions": list(self.mutants.functions),
            "baseline": {"score": self.baseline.score, "max_score": self.baseline.max_score},
            "mutants": {
                "generated": self.mutants.generated,
                "not_compiling": len(self.mutants.not_compiling),
                "compiled": len(self.mutants.mutants),
                "duplicates_dropped": self.mutants.duplicates,
                "no_ops_dropped": self.mutants.no_ops,
                "graded": len(self.outcomes),
                "sampled": self.sampled is not None,
                "equivalents": len(self.equivalents),
                "scored": len(self.scored),
                "killed": len(self.killed),
                "survived": len(self.survivors),
            },
            "kill_rate": self.kill_rate,
            "survivors": [o.to_dict() for o in self.survivors],
            "killed_equivalents": [o.to_dict() for o in self.killed_equivalents],
            "stale_equivalents": [{"id": e.id, "file": e.file, "reason": e.reason}
                                  for e in self.stale_equivalents],
            "killed_by_check": [{"check": c, "killed": n, "alone": a}
                                for c, n, a in self.killers()],
            "not_compiling": [{"id": m.id, "description": m.description}
                              for m in self.mutants.not_compiling],
            "outcomes": [o.to_dict() for o in self.outcomes],
        }


# --------------------------------------------------------------------------- equivalents


def load_equivalents(path: str | Path) -> list[Equivalent]:
    """The entries of a reviewed equivalents file; ``SensitivityError`` when it is unreadable
    or an entry lacks ``id``, ``file`` or ``reason``."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SensitivityError(f"--equivalents {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SensitivityError(f"--equivalents {path}: not valid TOML ({exc})") from exc
    entries = data.get("equivalent", [])
    if not isinstance(entries, list):
        raise SensitivityError(f"--equivalents {path}: 'equivalent' must be [[equivalent]] "
                               "tables")
    found = []
    for number, entry in enumerate(entries, 1):
        values = {key: entry.get(key) if isinstance(entry, dict) else None
                  for key in ("id", "file", "reason")}
        if not all(isinstance(value, str) and value.strip() for value in values.values()):
            raise SensitivityError(f"--equivalents {path}: entry {number} needs id, file and "
                                   "reason (non-empty strings)")
        found.append(Equivalent(**values))
    return found


def equivalents_for(entries: list[Equivalent], solution: str | Path) -> list[Equivalent]:
    """The entries about ``solution`` (matched by file name)."""
    name = Path(solution).name
    return [entry for entry in entries if Path(entry.file).name == name]


# --------------------------------------------------------------------------- measuring


def killed_by(report: SubmissionReport) -> tuple[str, ...]:
    """Why a report is short of full marks: the checks that apply and did not pass (failed,
    error, timeout, not judged…), or ``NOT_GRADABLE``; empty when it has full marks."""
    if not report.gradable:
        return (NOT_GRADABLE,)
    failed = tuple(r.check_id for r in report.results
                   if r.status not in (Status.PASSED, Status.NOT_APPLICABLE))
    if failed:
        return failed
    if not has_full_marks(report) or report.score + _EPSILON < report.max_score:
        return ("(short of full marks)",)
    return ()


def sample(mutants: list[Mutant], limit: int | None) -> list[Mutant]:
    """At most ``limit`` mutants spread evenly over the file (the same ones every run)."""
    if limit is None or limit >= len(mutants):
        return list(mutants)
    step = len(mutants) / limit
    return [mutants[int(i * step)] for i in range(limit)]


def prepare(solution: str | Path, style: str | None = None) -> MutantSet:
    path = Path(solution)
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SensitivityError(f"{path}: {exc.strerror or exc}") from exc
    try:
        return generate(source, str(path), style)
    except SyntaxError as exc:
        raise SensitivityError(f"{path}: does not parse ({exc.msg}, line {exc.lineno})") from exc
    except ValueError as exc:
        raise SensitivityError(f"{path}: {exc}") from exc


def measure(
    solution: str | Path,
    mutant_set: MutantSet,
    options: GradeOptions,
    *,
    equivalents: list[Equivalent] = (),
    jobs: int = 1,
    limit: int | None = None,
    only: list[str] | None = None,
    on_baseline: Callable[[SubmissionReport, SubmissionReport], None] | None = None,
    on_outcome: Callable[[int, int, Outcome], None] | None = None,
    grade_many=None,
) -> Measurement:
    """Grade the unmutated solution (the file as given and as ``ast.unparse`` writes it), then
    the mutants (``only``: these ids; ``limit``: a sample). ``SensitivityError`` when the
    unmutated solution is short of full marks. ``grade_many`` defaults to the grader's."""
    if grade_many is None:
        from moco_ref.run.pipeline import grade_many
    solution = Path(solution)
    equivalents = equivalents_for(list(equivalents), solution)
    by_id = {mutant.id: mutant for mutant in mutant_set.mutants}
    stale = [entry for entry in equivalents if entry.id not in by_id]
    chosen = mutant_set.mutants
    if only is not None:
        unknown = [mutant_id for mutant_id in only if mutant_id not in by_id]
        if unknown:
            raise SensitivityError(f"--mutant {unknown[0]}: no such mutant of {solution.name}")
        chosen = [by_id[mutant_id] for mutant_id in only]
    chosen = sample(chosen, limit)
    equivalent_of = {entry.id: entry for entry in equivalents}
    options = GradeOptions.from_dict({**options.to_dict(), "style": mutant_set.style})
    with tempfile.TemporaryDirectory(prefix="moco-ref-sensitivity-") as folder:
        root = Path(folder)
        # each file keeps the solution's name, in a folder of its own
        round_trip = _write(root / "unmutated", solution.name, mutant_set.original + "\n")
        as_given, written = grade_many([str(solution), str(round_trip)], options,
                                       jobs=min(jobs, 2))
        if on_baseline is not None:
            on_baseline(as_given, written)
        for report, what in ((as_given, str(solution)),
                             (written, f"{solution.name} as ast.unparse writes it")):
            if killed_by(report):
                raise SensitivityError(
                    f"the unmutated solution ({what}) is not at full marks "
                    f"({_score(report)}): measure on a correct solution")
        paths = [str(_write(root / f"m{index:04d}", solution.name, mutant.source))
                 for index, mutant in enumerate(chosen)]
        index_of = {path: index for index, path in enumerate(paths)}
        done: list[int] = []
        outcomes: list[Outcome | None] = [None] * len(chosen)

        def finished(report: SubmissionReport) -> None:
            index = index_of[report.submission]
            outcomes[index] = _outcome(chosen[index], report, equivalent_of)
            done.append(index)
            if on_outcome is not None:
                on_outcome(len(done), len(chosen), outcomes[index])

        reports = grade_many(paths, options, jobs=jobs, on_report=finished)
        for index, report in enumerate(reports):
            if outcomes[index] is None:
                outcomes[index] = _outcome(chosen[index], report, equivalent_of)
    return Measurement(str(solution), mutant_set.style, mutant_set, as_given,
                       [o for o in outcomes if o is not None],
                       sampled=len(chosen) if limit is not None or only is not None else None,
                       stale_equivalents=stale)


def _write(folder: Path, name: str, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(source, encoding="utf-8")
    return path


def _score(report: SubmissionReport) -> str:
    if not report.gradable:
        return "not gradable"
    return f"{report.score:g}/{report.max_score:g}"


def _outcome(mutant: Mutant, report: SubmissionReport,
             equivalent_of: dict[str, Equivalent]) -> Outcome:
    reasons = killed_by(report)
    return Outcome(mutant, bool(reasons), reasons, equivalent_of.get(mutant.id),
                   report.score, report.max_score, report.wall_seconds)


# --------------------------------------------------------------------------- the report


def report_lines(measurement: Measurement, min_kill_rate: float | None = None) -> list[str]:
    """The terminal report, plain text within 80 columns."""
    m = measurement
    counts = m.mutants
    lines = [f"moco-ref sensitivity: {m.solution}", f"style: {m.style}"]
    lines += textwrap.wrap("mutated: " + ", ".join(counts.functions), 80,
                           subsequent_indent="  ", break_on_hyphens=False)
    lines += [f"unmutated solution: {_score(m.baseline)}",
              f"mutants: {counts.generated} generated, {len(counts.mutants)} compiled, "
              f"{len(counts.not_compiling)} did not compile (discarded)"]
    if m.sampled is not None:
        lines.append(f"graded a sample of {m.sampled} of the {len(counts.mutants)} compiled "
                     "mutants (--limit/--mutant)")
    lines += [f"reviewed equivalents: {len(m.equivalents)} (left out of the kill rate)",
              f"killed: {len(m.killed)} of {len(m.scored)} = {m.kill_rate:.1%}"
              + (f" (required: {min_kill_rate:.1%})" if min_kill_rate is not None else "")]
    if m.survivors:
        lines += ["", f"surviving mutants ({len(m.survivors)}): bugs the grader misses"]
        for outcome in sorted(m.survivors, key=lambda o: (o.mutant.line, o.mutant.id)):
            lines += [f"  {outcome.mutant.description}", f"      id {outcome.mutant.id}"]
    if m.killed_equivalents:
        lines += ["", f"ERROR: {len(m.killed_equivalents)} reviewed equivalent(s) lost marks:",
                  "the equivalents file or the grader is wrong"]
        for outcome in m.killed_equivalents:
            lines += [f"  {outcome.mutant.description}",
                      f"      id {outcome.mutant.id}, killed by "
                      + ", ".join(outcome.killed_by)]
    if m.stale_equivalents:
        lines += ["", f"warning: {len(m.stale_equivalents)} equivalents entries match no "
                  "mutant (did the file change?):"]
        lines += [f"  {entry.id}" for entry in m.stale_equivalents]
    killers = m.killers()
    if killers:
        width = max(len("check"), *(len(check) for check, _, _ in killers))
        width = min(width, 56)
        lines += ["", "checks that killed mutants (alone: the only check that did):",
                  f"  {'check':<{width}}  killed  alone"]
        lines += [f"  {check[:width]:<{width}}  {count:>6}  {alone:>5}"
                  for check, count, alone in killers]
    return lines


def progress_line(done: int, total: int, outcome: Outcome) -> str:
    verdict = "killed" if outcome.killed else "SURVIVED"
    if outcome.equivalent is not None:
        verdict = "equiv-killed!" if outcome.killed else "equivalent"
    return f"[{done:>4}/{total}] {verdict:<13} {outcome.mutant.id}"
