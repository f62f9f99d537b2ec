"""What the ``components`` checks read: each protocol function's outputs paired with the cases
it answered — drawn again here from the same strategies and seed, never read back."""

from __future__ import annotations

from moco_ref.judge.assertions import SubmissionError
from moco_ref.judge.gaps import observed
from moco_ref.probe.cases import cases_fingerprint, component_cases
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.styles import COMPONENTS

# the entry point each kind of case calls, from the style table
COMPONENT_OF_KIND = {part.name: part.entry_points[0] for part in COMPONENTS.parts
                     if part.name != "moco_warmup"}


class ComponentsEvidence:
    """The ``components`` record paired with the cases it answers — drawn again here, from the
    same strategies and seed, never read back from the submission's process."""

    style = "components"

    def __init__(self, observations: dict, options: GradeOptions) -> None:
        self.options = options
        self.record = observations
        self.seed = int(observations.get("seed", options.seed))
        self._cases: dict[str, list] = {}

    @property
    def warmup(self) -> dict:
        return observed(self.record.get("moco_warmup")) or {}

    def cases(self, kind: str) -> list:
        if kind not in self._cases:
            self._cases[kind] = component_cases(kind, self.seed)
        return self._cases[kind]

    def outputs(self, kind: str) -> list[tuple[int, object, dict]]:
        """``[(case number, case, output)]`` for ``kind``; raises ``SubmissionError`` when the
        component is not defined, or when a case raised (with its traceback)."""
        outputs = observed(self.record.get(kind))
        if outputs is None:
            raise SubmissionError(
                f"{COMPONENT_OF_KIND[kind]} is not defined (the components protocol is in "
                "moco_ref/judge/COMPONENTS.md)")
        cases = self.cases(kind)
        fingerprint = self.record.get("fingerprints", {}).get(kind)
        if len(outputs) != len(cases) or fingerprint != cases_fingerprint(cases):
            raise SubmissionError(
                f"the submission's process ran other {kind} cases than the grader draws "
                f"({len(outputs)} vs {len(cases)}, fingerprint {fingerprint} vs "
                f"{cases_fingerprint(cases)}): observed with another version of hypothesis or "
                "of the harness? Grade with one environment for both.")
        for number, (case, output) in enumerate(zip(cases, outputs)):
            if "error" in output:
                raise SubmissionError(
                    f"{COMPONENT_OF_KIND[kind]} raised on case {number} ({case}):\n"
                    f"{output['error']}")
        return [(number, case, output) for number, (case, output) in enumerate(zip(cases, outputs))]

    def inferred(self) -> dict:
        return {"cases": {kind: len(self.record.get(kind) or []) for kind in COMPONENT_OF_KIND}}
