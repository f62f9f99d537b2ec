"""What a grading run may be told: the temperature to judge with, values an assignment pins,
which checks to run. Shared by the observing side, the judging side and the command line."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

STYLES = ("lab", "components", "builder")
VARIANTS = ("asymmetric", "symmetric")  # a builder module's loss: one pair, or both views


@dataclass(frozen=True)
class GradeOptions:
    style: str | None = None  # None: detect from the submission's names
    variant: str | None = None  # builder: None detects it from what forward returns
    temperature: float = 0.2
    expect_m: float | None = None  # pinned by an assignment; otherwise inferred and reported
    expect_capacity: int | None = None
    expect_batch_size: int | None = None
    seed: int = 0  # probe seed; grading is deterministic for a given seed
    checks: tuple[str, ...] = field(default_factory=tuple)  # check ids or families; empty = all
    execute_all_cells: bool = False  # notebooks: run every cell instead of definitions only
    timeout: float = 60.0  # wall-clock seconds for the whole submission
    memory_mb: int = 2048  # the job's memory, all its processes together (proportional sets)
    check_timeout: float | None = 30.0  # seconds for each observed part (None: no own limit)
    allow_reference_import: bool = False  # may the submission import moco_ref?
    # the course's rubric as sorted (key, value) pairs (moco_ref.judge.rubric); () = default
    rubric: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GradeOptions:
        data = dict(data)
        data["checks"] = tuple(data.get("checks", ()))
        data["rubric"] = tuple((str(k), float(v)) for k, v in data.get("rubric", ()))
        return cls(**data)

    def selects(self, check_id: str) -> bool:
        """A whole check id, or its family: ``I1`` selects ``I1-…`` and never ``I10-…``."""
        family = check_id.split("-", 1)[0]
        return not self.checks or any(chosen in (check_id, family) for chosen in self.checks)
