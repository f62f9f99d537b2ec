"""The parts a style's observation is split into, and how the grader puts them together.

A part is the record entry of one entry point (``moco_ref.probe.styles``: ``lab`` has
``moco_warmup`` and ``train_moco``; ``components`` one part per protocol function); a style
without parts (``builder``) is observed whole, as the one part ``WHOLE``. Each part run also
returns the rest of its record (shared entries such as the probe or the seed), which
``assemble`` merges. Observing a part is ``moco_ref.observe.parts``'s job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moco_ref.probe.styles import OBSERVED_STYLES, Part

WHOLE = "all"
INPUT_MUTATED = "input_mutated"  # train_moco changed the probe's images x in place
PROBE_DTYPE = "probe_dtype"  # torch's default dtype when the probe was built (lab)
DEFINED_KEY = "defined"  # components record: which entry points each part saw defined

PARTS: dict[str, tuple[Part, ...]] = {
    style.name: style.parts for style in OBSERVED_STYLES.values() if style.parts}


def part_names(style: str | None) -> list[str]:
    return [part.name for part in PARTS.get(style or "", ())] or [WHOLE]


def assemble(style: str, meta: list[dict], entries: dict[str, object]) -> dict:
    """One record from the parts' entries and the rest of the record each part run gave."""
    if WHOLE in entries:
        whole = entries[WHOLE]
        return dict(whole) if isinstance(whole, dict) else {WHOLE: whole}
    record: dict = {}
    defined: dict = {}
    for rest in meta:
        for key, value in rest.items():
            if key == DEFINED_KEY and isinstance(value, dict):
                defined.update(value)
            else:
                record.setdefault(key, value)
    known = OBSERVED_STYLES.get(style)
    if defined or (known is not None and known.shares_defined):
        record[DEFINED_KEY] = defined
    record.update(entries)
    return record


# --------------------------------------------------------------------------- what arrives


def _texts(value, limit: int = 200) -> tuple[str, ...]:
    return tuple(item for item in value[:limit] if isinstance(item, str)) \
        if isinstance(value, list) else ()


def _names_to(value, kind: type, limit: int = 10_000) -> dict:
    if not isinstance(value, dict):
        return {}
    return {str(key): item for key, item in list(value.items())[:limit]
            if isinstance(key, str) and isinstance(item, kind)}


@dataclass(frozen=True)
class Stage:
    """What the submission's process says once the submission is loaded — in its own words,
    never trusted for a verdict: the style it detected, its loader's notes, which entry points
    each part found, and the notebook statements it skipped (name → where)."""

    style: str
    notes: tuple[str, ...] = ()
    defined: dict = field(default_factory=dict)  # entry point → bool
    skipped: dict = field(default_factory=dict)  # name → the statement that would bind it

    @classmethod
    def from_frame(cls, payload) -> Stage | None:
        """The stage a STAGE frame describes, or None when it is not one."""
        if not isinstance(payload, dict):
            return None
        return cls(str(payload.get("style"))[:80], _texts(payload.get("notes")),
                   _names_to(payload.get("defined"), bool),
                   _names_to(payload.get("skipped"), str))


@dataclass(frozen=True)
class ObservedPart:
    """One part as the submission's process sent it: its record entry and the rest of its
    record (``meta``), or why observing it raised (``failed``). Validated before use."""

    name: str
    data: object = None
    meta: object = None
    failed: str | None = None

    @classmethod
    def from_frame(cls, payload) -> ObservedPart | None:
        if not isinstance(payload, dict) or not isinstance(payload.get("part"), str):
            return None
        if "failed" in payload:
            return cls(payload["part"], failed=str(payload["failed"]))
        return cls(payload["part"], payload.get("data"), payload.get("meta"))


@dataclass(frozen=True)
class Unobserved:
    """A part with no observation (it ran out of time, its process died, or what it sent was
    discarded): why, and whether time ran out. The judge reads it as "not judged"."""

    part: str  # "train_moco", "moco_warmup", "queue", …, or "all"
    reason: str
    timed_out: bool
