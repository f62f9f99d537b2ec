"""The submission styles as the judging side knows them: how a part's record is validated
against the probe the grader asked for, which evidence the checks read, and what a record
with missing parts still needs before it is judged. The observing half of each style
(recognition, parts, observer) is ``moco_ref.observe.styles``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.evidence import ComponentsEvidence, LabEvidence
from moco_ref.judge.record import (
    validate_builder_part,
    validate_components_part,
    validate_lab_part,
)
from moco_ref.observe.options import GradeOptions
from moco_ref.observe.strategies import cases_fingerprint, component_cases, default_lab_probe
from moco_ref.observe.styles import COMPONENTS, OBSERVED_STYLES, ObservedStyle


@dataclass(frozen=True)
class JudgedStyle:
    observed: ObservedStyle
    evidence: type  # built from the record; what the checks read
    validate: Callable[[str, object, dict, GradeOptions], None]  # (part, data, meta, options)
    complete: Callable[[dict, dict, GradeOptions], None]  # (record, stage's defined, options)

    @property
    def name(self) -> str:
        return self.observed.name


def _complete_lab(record: dict, defined: dict, options: GradeOptions) -> None:
    record.setdefault("probe", default_lab_probe(options.seed).to_dict())


def _complete_components(record: dict, defined: dict, options: GradeOptions) -> None:
    """A components record whose part runs died still needs the shared entries (seed,
    fingerprints, which entry points are defined) for its other entries to be read: the grader
    draws the cases itself and takes ``defined`` from the worker's stage report."""
    record.setdefault("seed", int(options.seed))
    fingerprints = record.setdefault("fingerprints", {})
    for part in COMPONENTS.parts:
        if part.name != "moco_warmup":
            fingerprints.setdefault(part.name,
                                    cases_fingerprint(component_cases(part.name, options.seed)))
    merged = record.setdefault("defined", {})
    for part in COMPONENTS.parts:
        for entry in part.entry_points:
            if entry != "moco_warmup":
                merged.setdefault(entry, bool(defined.get(entry, False)))



def _complete_nothing(record: dict, defined: dict, options: GradeOptions) -> None:
    return None


JUDGED_STYLES: dict[str, JudgedStyle] = {
    "lab": JudgedStyle(OBSERVED_STYLES["lab"], LabEvidence, validate_lab_part, _complete_lab),
    "components": JudgedStyle(OBSERVED_STYLES["components"], ComponentsEvidence,
                              validate_components_part, _complete_components),
    "builder": JudgedStyle(OBSERVED_STYLES["builder"], BuilderEvidence, validate_builder_part,
                           _complete_nothing),
}
