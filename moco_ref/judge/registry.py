"""The checks the harness knows, and which submission style a namespace is.

A check is a named function whose docstring states the contract it enforces
(scikit-learn's ``estimator_checks`` style). It is registered under an id usable with
``-k``/``--check`` (``I3-fifo-keeps-newest``), a title, the family of the invariant it pins
(``I1`` … ``I9``, ``contract``, ``warmup``), points, and one implementation per submission
style it applies to. For any other style it is reported not applicable, never passed.

Families: ``I1``–``I9`` are DESIGN's invariants (``I5`` holds the three warm-up *values* of
``moco_warmup``); ``contract`` is what ``train_moco`` (or the components protocol) must
return or define; ``warmup`` is the shape of ``moco_warmup``'s result. The empty-queue
warm-up *batch* of training is part of I8.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

FAMILIES = ("contract", "I1", "I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9", "warmup")

CheckFunction = Callable[[object], "str | None"]


@dataclass
class CheckSpec:
    check_id: str
    title: str
    family: str
    points: float
    docstring: str
    implementations: dict[str, CheckFunction] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.check_id

    @property
    def styles(self) -> tuple[str, ...]:
        return tuple(self.implementations)

    def applies_to(self, style: str) -> bool:
        return style in self.implementations


_CHECKS: dict[str, CheckSpec] = {}


def check(check_id: str, title: str, family: str, points: float, styles: tuple[str, ...]):
    """Register the decorated function as the implementation of ``check_id`` for ``styles``.

    The first registration of an id fixes its title, family, points and docstring; a later
    one (another style's implementation) must agree on family and points.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}")
    if not check_id.startswith(family + "-"):
        raise ValueError(f"check id {check_id!r} must start with its family {family!r}")

    def decorate(function: CheckFunction) -> CheckFunction:
        spec = _CHECKS.get(check_id)
        if spec is None:
            doc = " ".join((function.__doc__ or "").split())
            spec = _CHECKS[check_id] = CheckSpec(check_id, title, family, float(points), doc)
        elif spec.family != family or spec.points != float(points):
            raise ValueError(f"check {check_id!r} registered twice with different family/points")
        for style in styles:
            if style in spec.implementations:
                raise ValueError(f"check {check_id!r} already has a {style!r} implementation")
            spec.implementations[style] = function
        function.check_id = check_id
        return function

    return decorate


def _load() -> None:
    # The modules register their checks on import.
    from moco_ref.judge import builder_checks, component_checks, lab_checks  # noqa: F401


def all_checks(style: str | None = None) -> list[CheckSpec]:
    """Every registered check (those that apply to ``style`` when given), by family, in
    registration order within a family."""
    _load()
    specs = [s for s in _CHECKS.values() if style is None or s.applies_to(style)]
    return sorted(specs, key=lambda s: FAMILIES.index(s.family))


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
