"""The verdict of one check, shared by the harness (which produces it) and the reports
(which render it); ``to_dict`` and ``from_dict`` are its JSON form, both ways."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Status(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"  # the check could not run: the submission raised or gave no observation
    TIMEOUT = "timeout"
    NOT_JUDGED = "not judged"  # a precondition failed (another check names it) or never reached
    NOT_APPLICABLE = "not applicable"  # the check never applies to the style


@dataclass(frozen=True)
class CheckResult:
    check_id: str  # e.g. "I3-fifo-keeps-newest"; usable with `-k` and `--check`
    title: str
    family: str  # "I1" … "I9", "contract", "warmup"
    max_points: float
    status: Status
    message: str = ""  # names the misconception and shows the evidence when not passed
    details: dict = field(default_factory=dict)  # machine-readable evidence
    # the grader's own seconds judging this check (JUnit's per-test time; not its verdict)
    seconds: float = field(default=0.0, compare=False)

    @property
    def points(self) -> float:
        return self.max_points if self.status is Status.PASSED else 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        data["points"] = self.points
        return data

    @classmethod
    def from_dict(cls, data: dict) -> CheckResult:
        """The result ``to_dict`` wrote (``points`` is recomputed, not read)."""
        return cls(data["check_id"], data["title"], data["family"], float(data["max_points"]),
                   Status(data["status"]), data.get("message", ""),
                   dict(data.get("details") or {}), _seconds(data.get("seconds")))


@dataclass
class SubmissionReport:
    submission: str  # path or module name as given
    style: str  # "lab", "components", "builder"
    gradable: bool
    results: list[CheckResult] = field(default_factory=list)
    inferred: dict = field(default_factory=dict)  # e.g. {"m": 0.95, "capacity": 240, ...}
    notes: list[str] = field(default_factory=list)  # e.g. skipped notebook cells
    traceback: str = ""  # when not gradable
    stdout: str = ""  # captured, capped
    stderr: str = ""
    wall_seconds: float = 0.0
    isolation: str = ""  # how the submission's process was isolated (the grader's own words)
    # the grader's own failure while grading it (an internal error, its warm process died):
    # such a report is never cached and never stands as the student's grade
    grader_trouble: str = ""
    # for the course staff only, never rendered for the student: code that inspects the
    # grader's world (``judge.inspection``), each note naming its line
    staff_notes: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        """Points earned, in cents (each check's points have at most two decimals)."""
        return round(sum(r.points for r in self.results), 2)

    @property
    def max_score(self) -> float:
        """The rubric's total for the style: a check that does not apply gave its share to
        the others (``Rubric.points``), so this never depends on the submission."""
        return round(sum(r.max_points for r in self.results
                         if r.status is not Status.NOT_APPLICABLE), 2)

    def to_dict(self) -> dict:
        return {
            "submission": self.submission,
            "style": self.style,
            "gradable": self.gradable,
            "score": self.score,
            "max_score": self.max_score,
            "inferred": self.inferred,
            "notes": self.notes,
            "traceback": self.traceback,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "wall_seconds": self.wall_seconds,
            "isolation": self.isolation,
            "grader_trouble": self.grader_trouble,
            "staff_notes": self.staff_notes,
            "results": [r.to_dict() for r in self.results],
        }

    @classmethod
    def from_dict(cls, data: dict) -> SubmissionReport:
        """The report ``to_dict`` wrote (a cached or shared one); ``score`` and ``max_score``
        are recomputed from the results, not read."""
        return cls(
            submission=data["submission"], style=data["style"], gradable=bool(data["gradable"]),
            results=[CheckResult.from_dict(item) for item in data.get("results", [])],
            inferred=dict(data.get("inferred") or {}), notes=list(data.get("notes") or []),
            traceback=data.get("traceback", ""), stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""), wall_seconds=float(data.get("wall_seconds", 0.0)),
            isolation=str(data.get("isolation", "")),
            grader_trouble=str(data.get("grader_trouble", "")),
            staff_notes=[str(note) for note in data.get("staff_notes") or []][:20],
        )


def _seconds(value) -> float:
    """A recorded judging time, or 0 where a report (an older cache entry) has none."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return 0.0
    return seconds if 0.0 <= seconds < 1e6 else 0.0
