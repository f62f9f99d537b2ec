"""What a grade means for a gate: the ``--min-score`` threshold, which families failed, and
the command that reruns one check."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.probe.options import GradeOptions, command_line_of
from moco_ref.report.text import shown_name

NOT_PASSED = (Status.FAILED, Status.ERROR, Status.TIMEOUT, Status.NOT_JUDGED)
_EPSILON = 1e-9


@dataclass(frozen=True)
class MinScore:
    """``None`` value: full marks. ``percent``: the value is a percentage of the maximum."""

    value: float | None = None
    percent: bool = False

    @classmethod
    def parse(cls, text: str) -> MinScore:
        """``"38"`` (points) or ``"90%"`` (of the maximum)."""
        raw = text.strip()
        percent = raw.endswith("%")
        try:
            number = float(raw[:-1] if percent else raw)
        except ValueError:
            raise ValueError(f"--min-score wants points (e.g. 90) or a percentage (e.g. 90%), "
                             f"not {text!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"--min-score must be a finite number, not {text!r}")
        if number < 0 or (percent and number > 100):
            raise ValueError(f"--min-score must be ≥ 0 (and ≤ 100%), got {text}")
        return cls(number, percent)

    def threshold(self, report: SubmissionReport) -> float:
        if self.value is None:
            return report.max_score
        return report.max_score * self.value / 100 if self.percent else self.value

    def describe(self) -> str:
        if self.value is None:
            return "full marks"
        return f"{self.value:g}%" if self.percent else f"{self.value:g} points"


def meets(report: SubmissionReport, minimum: MinScore) -> bool:
    """A not-gradable submission never meets a threshold, whatever its value."""
    return report.gradable and report.score + _EPSILON >= minimum.threshold(report)


def points_str(value: float) -> str:
    """``9.52``, ``100``: points to two decimals, no trailing zeros."""
    return f"{round(value + 0.0, 2):g}"


def told_elsewhere(result: CheckResult) -> bool:
    """A check not judged because another one failed: its one line says which, the other
    check carries the details."""
    return result.status is Status.NOT_JUDGED and "needs" in result.details


def failed_families(report: SubmissionReport) -> list[str]:
    return sorted({result.family for result in report.results if result.status in NOT_PASSED})


def has_full_marks(report: SubmissionReport) -> bool:
    passed_any = any(result.status is Status.PASSED for result in report.results)
    return report.gradable and passed_any and not failed_families(report)


def rerun_command(submission: str, check_id: str, options: GradeOptions | None = None) -> str:
    """The command that grades just this check again, under the same options (the
    submission's path as ``text.shown_name`` shows it: printable on one line)."""
    parts = ["moco-ref", "grade", shown_name(submission, cap=4096), "--check", check_id]
    parts += command_line_of(options or GradeOptions())
    return shlex.join(parts)
