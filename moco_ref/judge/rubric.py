"""What each check is worth: a fixed maximum per style, shared out by invariant family.

Every submission of a style is graded out of the same total (100 by default): each family
that applies to the style gets a share of it in proportion to the family's weight (every
family weighs 1, the shape of ``moco_warmup``'s result 0.5), and a family's share is split
between its checks in proportion to their declared points. So no invariant is worth a
sliver: a module with no EMA at all loses the whole I7 share, and a missing mask the I4
share. Only a check that never applies to the style (or reads a part the style's protocol
makes optional and the submission left out) leaves the total.

Points follow the harm. A bug is charged to the family whose law it breaks, once — and when its
failure means a part of MoCo never ran, the families of that part are charged with it: a failed
check that *disables* families takes over the points of their checks that passed (those passed
only because the part they judge was never used), so the bug costs at least those families'
share, and a point already lost to one of their own failures is not lost again. Two failures
disable: the queue never used as negatives (``I8-empty-queue-in-batch`` with the in-batch loss
at every step after the first: the dictionary, I2, I3 and I4, is dead) and gradients that
accumulate across steps (``contract-fresh-gradients``: the gradient step no longer applies the
loss's gradient, so the loss family I8 is charged). Any check may name what its failure
disables (``details["disables"]``). The total is unchanged: points move, in cents
(``charge_disabled``).

A course sets its own weights in a TOML file (``moco-ref grade --rubric FILE``; ``moco-ref
rubric show [FILE]`` prints the effective points)::

    total = 100
    [families]
    I4 = 2          # the mask counts double
    warmup = 0
    [checks]
    "I8-key-from-other-view" = 3   # relative to the other I8 checks' points
    [visibility]    # per check or family: visible, after_due_date, after_published, hidden
    I4 = "after_due_date"
    [output]
    show_submission_output = false  # the submission's stdout/stderr in student feedback

The rubric travels in ``GradeOptions.rubric`` as sorted ``(key, value)`` pairs (``total``,
``family:I4``, ``check:I8-…``), so it is part of the cache key of every report.

What a student sees follows the ``[visibility]`` (``shown_now``): a ``visible`` check at once; one
``after_due_date`` or ``after_published`` only once the teacher releases it (``released``, set by
``moco-ref grade --release-feedback``: feedback pages and PrairieLearn results honour it, Gradescope
releases such tests on its own schedule); a ``hidden`` check never.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import tomllib

from moco_ref.judge.registry import FAMILIES, all_checks, get_check, unknown_selectors
from moco_ref.judge.results import CheckResult, Status
from moco_ref.probe.options import family_of

DEFAULT_TOTAL = 100.0
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")  # shown soonest first
SHOWN_LATER = ("after_due_date", "after_published")
DEFAULT_FAMILY_WEIGHTS = {family: 1.0 for family in FAMILIES} | {"warmup": 0.5}


class RubricError(ValueError):
    """A rubric file that cannot be used, said in one line."""


@dataclass(frozen=True)
class Rubric:
    total: float = DEFAULT_TOTAL
    families: dict[str, float] = field(default_factory=dict)  # overrides of the defaults
    checks: dict[str, float] = field(default_factory=dict)  # in-family weights (default: points)
    # how the feedback shows (not what is judged: left out of the options and the cache key)
    visibility: dict[str, str] = field(default_factory=dict)  # check id or family -> one of
    show_submission_output: bool = False
    # the teacher released what is shown later (``--release-feedback``; not in the file either)
    released: bool = False

    def visibility_of(self, check_id: str) -> str:
        """The check's own entry, else its family's, else ``visible``."""
        family = family_of(check_id)
        return self.visibility.get(check_id) or self.visibility.get(family) or "visible"

    def shown_now(self, check_id: str) -> bool:
        """Whether a student may see the check's outcome, points and evidence now: it is
        ``visible``, or shown later and the teacher has ``released`` it; never when
        ``hidden``."""
        visibility = self.visibility_of(check_id)
        return visibility == "visible" or (self.released and visibility in SHOWN_LATER)

    def family_weight(self, family: str) -> float:
        return self.families.get(family, DEFAULT_FAMILY_WEIGHTS[family])

    def points(self, style: str, not_applicable=frozenset()) -> dict[str, float]:
        """``{check id: points}`` for every check that applies to ``style`` — decimals of at
        most two places that add up to ``total`` exactly (unless every weight is 0).

        The one rule for checks that do not apply to a submission (``not_applicable``, e.g.
        the across-ranks checks of a single-process module): a check's share goes to the
        applicable checks of its family, in proportion to their weights; a family none of
        whose checks applies gives its share to the other families. A submission's own
        behaviour never shrinks its maximum: every submission of a style is graded out of
        the same total."""
        specs = [s for s in all_checks(style) if s.check_id not in not_applicable]
        families = [f for f in FAMILIES if any(s.family == f for s in specs)]
        weights = sum(self.family_weight(f) for f in families)
        points = {}
        for family in families:
            members = [s for s in specs if s.family == family]
            share = self.total * self.family_weight(family) / weights if weights else 0.0
            inner = sum(self.checks.get(s.check_id, s.points) for s in members)
            for spec in members:
                weight = self.checks.get(spec.check_id, spec.points)
                points[spec.check_id] = share * weight / inner if inner else 0.0
        return in_cents(points, self.total)

    def to_pairs(self) -> tuple[tuple[str, float], ...]:
        pairs = [("total", self.total)]
        pairs += [(f"family:{name}", value) for name, value in self.families.items()]
        pairs += [(f"check:{name}", value) for name, value in self.checks.items()]
        return tuple(sorted(pairs))

    @classmethod
    def from_pairs(cls, pairs: Iterable) -> Rubric:
        total, families, checks = DEFAULT_TOTAL, {}, {}
        for key, value in pairs:
            kind, _, name = str(key).partition(":")
            if kind == "total":
                total = float(value)
            elif kind == "family":
                families[name] = float(value)
            elif kind == "check":
                checks[name] = float(value)
        return cls(total, families, checks)


def in_cents(points: dict[str, float], total: float) -> dict[str, float]:
    """``points`` rounded to two decimals by the largest-remainder rule, so that they add up
    to ``total`` (rounded to cents) exactly — no float noise in any output."""
    if not points or sum(points.values()) <= 0:
        return {name: 0.0 for name in points}
    cents = {name: value * 100 for name, value in points.items()}
    floors = {name: math.floor(value + 1e-9) for name, value in cents.items()}
    left = round(total * 100) - sum(floors.values())
    by_remainder = sorted(cents, key=lambda name: (floors[name] - cents[name], name))
    for name in by_remainder[:max(0, left)]:
        floors[name] += 1
    return {name: floors[name] / 100 for name in points}


DEFAULT_RUBRIC = Rubric()

DICTIONARY = ("I2", "I3", "I4")  # the queue's entries, its FIFO, its mask


def disabled_families(result: CheckResult) -> tuple[str, ...]:
    """The families a failed check's failure disables (see the module's docstring): those it
    names in ``details["disables"]`` (the check that judged the failure decides); none for
    another failure."""
    if result.status is not Status.FAILED:
        return ()
    named = (result.details or {}).get("disables")
    if isinstance(named, (list, tuple)):
        return tuple(f for f in FAMILIES if f in named and f != result.family)
    return ()


def charge_disabled(results: list[CheckResult]) -> list[CheckResult]:
    """Each failed check that disables families (``disabled_families``) takes over the points
    of their checks that passed: its maximum grows by them, theirs become 0 (with
    ``details["charged_to"]``). A check's points move at most once and a failed check of a
    disabled family keeps its own, so no point is charged twice; the total is unchanged."""
    results = list(results)
    moved: set[int] = set()
    for i, result in enumerate(results):
        families = disabled_families(result)
        if not families:
            continue
        taken = 0.0
        for j, other in enumerate(results):
            if j == i or j in moved or other.family not in families \
                    or other.status is not Status.PASSED or other.max_points <= 0:
                continue
            moved.add(j)
            taken += other.max_points
            results[j] = replace(other, max_points=0.0,
                                 details={**other.details, "charged_to": result.check_id,
                                          "points_before_charge": other.max_points})
        if taken:
            note = (f" (what this breaks disables {', '.join(families)}: the bug is charged "
                    f"their {taken:.2f} points too, once)")
            results[i] = replace(
                result, max_points=round(result.max_points + taken, 2),
                message=result.message + note,
                details={**result.details, "disables": list(families),
                         "charged_points": round(taken, 2), "charge_note": note})
    return results


def load_rubric(path) -> Rubric:
    """The rubric in a TOML file; ``RubricError`` (one line) when it cannot be used."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise RubricError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RubricError(f"{path}: not valid TOML ({exc})") from None
    return rubric_from_mapping(data, str(path))


def rubric_from_mapping(data: dict, where: str = "rubric") -> Rubric:
    unknown = sorted(set(data) - {"total", "families", "checks", "visibility", "output"})
    if unknown:
        raise RubricError(f"{where}: unknown key {unknown[0]!r} (expected total, [families], "
                          "[checks], [visibility], [output])")
    total = _weight(data.get("total", DEFAULT_TOTAL), f"{where}: total")
    if total <= 0:
        raise RubricError(f"{where}: total must be positive, not {total:g}")
    families = _table(data.get("families", {}), f"{where}: [families]")
    bad = [name for name in families if name not in FAMILIES]
    if bad:
        raise RubricError(f"{where}: [families] has no family {bad[0]!r} (families: "
                          f"{', '.join(FAMILIES)})")
    checks = _table(data.get("checks", {}), f"{where}: [checks]")
    bad = unknown_selectors(checks)
    if bad or any(name in FAMILIES for name in checks):
        name = (bad or [n for n in checks if n in FAMILIES])[0]
        raise RubricError(f"{where}: [checks] has no check {name!r} (`moco-ref checks` lists "
                          "them; families go in [families])")
    for name in checks:
        get_check(name)
    visibility = data.get("visibility", {})
    if not isinstance(visibility, dict):
        raise RubricError(f"{where}: [visibility] must be a table of check or family = "
                          "visibility")
    for name, value in visibility.items():
        if name not in FAMILIES and unknown_selectors([name]):
            raise RubricError(f"{where}: [visibility] has no check or family {name!r}")
        if value not in VISIBILITIES:
            raise RubricError(f"{where}: [visibility] {name} must be one of "
                              f"{', '.join(VISIBILITIES)}, not {value!r}")
    output = data.get("output", {})
    unknown = sorted(set(output) - {"show_submission_output"}) if isinstance(output, dict) \
        else ["(not a table)"]
    if unknown:
        raise RubricError(f"{where}: [output] has no setting {unknown[0]!r} (expected "
                          "show_submission_output)")
    show = output.get("show_submission_output", False)
    if not isinstance(show, bool):
        raise RubricError(f"{where}: [output] show_submission_output must be true or false")
    return Rubric(total, families, checks, dict(visibility), show)


def _table(value, where: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise RubricError(f"{where} must be a table of name = weight")
    return {str(name): _weight(weight, f"{where} {name}") for name, weight in value.items()}


def _weight(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            float(value)) or float(value) < 0:
        raise RubricError(f"{where} must be a number ≥ 0, not {value!r}")
    return float(value)
