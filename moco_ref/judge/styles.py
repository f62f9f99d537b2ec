"""The judge's one dispatcher by style: how a part's record is validated against the probe
the grader asked for (``validate_part``), which evidence the checks read, and what a record
with missing parts still needs before it is judged. The style table itself (names, entry
points, parts, recognition) is the contract, ``moco_ref.probe.styles``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.builder_record import validate_builder_part
from moco_ref.judge.components_evidence import ComponentsEvidence
from moco_ref.judge.components_record import validate_components_part
from moco_ref.judge.lab_evidence import LabEvidence
from moco_ref.judge.lab_record import validate_lab_part
from moco_ref.judge.record import GraderOutOfTime, Invalid, checking_until, need
from moco_ref.probe.cases import cases_fingerprint, component_cases, default_lab_probe
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.styles import COMPONENTS, OBSERVED_STYLES, ObservedStyle
from moco_ref.probe.wall import WALL


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
    record.setdefault("probe", default_lab_probe(options.seed, options.probe_key).to_dict())


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


def validate_part(style: str, name: str, data, meta, options: GradeOptions, *,
                  deadline: float | None = None) -> str:
    """"" if the part's observations are well-formed and consistent with the probe the grader
    ran; otherwise what is wrong with them (the part is then discarded, and every check that
    needs it reports an error — never a pass). Past ``deadline`` it raises
    ``GraderOutOfTime``: the grader's trouble, never the submission's verdict."""
    try:
        with torch.random.fork_rng(devices=[]), checking_until(deadline):
            known = JUDGED_STYLES.get(style)
            need(known is not None, f"no style {style!r} is judged")
            need(isinstance(meta, dict), "the record's shared entries are not a dict")
            WALL.check(data, "the part", types=False)  # before any work is done on the part
            WALL.check(meta, "the record's shared entries", types=False)
            known.validate(name, data, meta, options)
            WALL.check(data, "the part", tensors=False)
    except Invalid as problem:
        return str(problem)
    except GraderOutOfTime:
        raise
    except Exception as exc:  # noqa: BLE001 - malformed beyond what the checks foresee
        return f"the record could not be read ({type(exc).__name__}: {exc})"
    return ""
