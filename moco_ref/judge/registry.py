"""The checks the harness knows.

A check is declared once, in the module of the invariant family it pins
(``moco_ref.judge.checks.i3_fifo`` …): an id usable with ``-k``/``--check``
(``I3-fifo-keeps-newest``), a title, points and the contract it enforces
(scikit-learn's ``estimator_checks`` style). Each style it applies to has an implementation
beside it, named after the id, whose docstring says how that style is judged. For any other
style the check is reported not applicable, never passed.

Families: ``I1``–``I9`` are DESIGN's invariants (``I5`` holds the three warm-up *values* of
``moco_warmup``); ``contract`` is what ``train_moco`` (or the components protocol) must
return or define; ``warmup`` is the shape of ``moco_warmup``'s result. The empty-queue
warm-up *batch* of training is part of I8.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from moco_ref.probe.options import STYLES, family_of

# Every family of checks, in report order, with the title its section has on a student's page:
# a new family is one entry here.
FAMILY_TITLES = {
    "contract": "the function's contract",
    "I1": "I1 — no gradient into the key encoder",
    "I2": "I2 — the stored keys are the key encoder's",
    "I3": "I3 — the queue is FIFO, newest kept",
    "I4": "I4 — same-source negatives masked",
    "I5": "I5 — warm-up values",
    "I6": "I6 — the order of a step",
    "I7": "I7 — the EMA law",
    "I8": "I8 — the loss",
    "I9": "I9 — the batch is not its own negatives",
    "warmup": "moco_warmup",
}
FAMILIES = tuple(FAMILY_TITLES)

CheckFunction = Callable[[object], "str | None"]


@dataclass
class CheckSpec:
    """One check: declared once (id, title, points, the contract it enforces), judged by one
    implementation per style it applies to, each with its own "how this style is judged"
    docstring."""

    check_id: str
    title: str
    family: str
    points: float
    contract: str
    implementations: dict[str, CheckFunction] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.check_id

    @property
    def styles(self) -> tuple[str, ...]:
        return tuple(self.implementations)

    def applies_to(self, style: str) -> bool:
        return style in self.implementations

    def how_judged(self, style: str) -> str:
        """The docstring of ``style``'s implementation, on one line."""
        return " ".join((self.implementations[style].__doc__ or "").split())

    def function_name(self, style: str) -> str:
        """What an implementation must be called: the id in snake case, plus the style when
        the function serves that style alone."""
        return function_name(self.check_id, style if self._single(style) else None)

    def _single(self, style: str) -> bool:
        function = self.implementations[style]
        return sum(f is function for f in self.implementations.values()) == 1

    def judges(self, *styles: str):
        """Register the decorated function as this check's implementation for ``styles``."""

        def decorate(function: CheckFunction) -> CheckFunction:
            for style in styles:
                if style not in STYLES:
                    raise ValueError(f"check {self.check_id!r}: unknown style {style!r}")
                if style in self.implementations:
                    raise ValueError(f"check {self.check_id!r} already has a {style!r} "
                                     "implementation")
                self.implementations[style] = function
            expected = function_name(self.check_id, styles[0] if len(styles) == 1 else None)
            if function.__name__ != expected:
                raise ValueError(f"the {'/'.join(styles)} implementation of {self.check_id!r} "
                                 f"must be named {expected}, not {function.__name__}")
            function.check_id = self.check_id
            return function

        return decorate


_CHECKS: dict[str, CheckSpec] = {}


def function_name(check_id: str, style: str | None) -> str:
    return check_id.lower().replace("-", "_") + (f"_{style}" if style else "")


def check(check_id: str, title: str, *, points: float, contract: str) -> CheckSpec:
    """Declare a check once; its implementations register with ``@SPEC.judges(style, ...)``."""
    family = family_of(check_id)
    if family not in FAMILIES or check_id == family:
        raise ValueError(f"check id {check_id!r} must start with one of {FAMILIES} and a dash")
    if check_id in _CHECKS:
        raise ValueError(f"check {check_id!r} is declared twice")
    spec = _CHECKS[check_id] = CheckSpec(check_id, title, family, float(points),
                                         " ".join(contract.split()))
    return spec


def _load() -> None:
    # The family modules declare their checks on import.
    import moco_ref.judge.checks  # noqa: F401


def all_checks(style: str | None = None) -> list[CheckSpec]:
    """Every declared check (those that apply to ``style`` when given), by family, in
    declaration order within a family."""
    _load()
    specs = [s for s in _CHECKS.values() if style is None or s.applies_to(style)]
    return sorted(specs, key=lambda s: FAMILIES.index(s.family))


def unknown_selectors(selectors) -> list[str]:
    """The selectors that name no check and no family."""
    ids = {spec.check_id for spec in all_checks()}
    return [s for s in selectors if s not in ids and s not in FAMILIES]


# Why a check does not apply to a style, when there is more to say than "it does not":
# keyed by style, then by check id or family (the id wins).
NOT_APPLICABLE_BECAUSE: dict[str, dict[str, str]] = {
    "builder": {
        "I4": "a builder module's forward(im_q, im_k) gets no source ids, so there is no "
              "same-source mask to check",
        "I3-ids-move-with-keys": "a builder module keeps no ids in its queue",
        "I5": "a builder submission defines no moco_warmup",
        "warmup": "a builder submission defines no moco_warmup",
        "I8-empty-queue-in-batch": "the official queue starts full of random keys: there is no "
                                   "empty-queue batch",
    },
}


def not_applicable_reason(spec: CheckSpec, style: str) -> str:
    """Why ``spec`` is reported not applicable to ``style``."""
    reasons = NOT_APPLICABLE_BECAUSE.get(style, {})
    return reasons.get(spec.check_id) or reasons.get(spec.family) or (
        f"does not apply to {style} submissions")


def get_check(check_id: str) -> CheckSpec:
    _load()
    return _CHECKS[check_id]
