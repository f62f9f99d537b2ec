"""What a grading run may be told: the temperature to judge with, values an assignment pins,
which checks to run. Shared by the observing side, the judging side and the command line."""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field, replace

from moco_ref.probe.styles import STYLE_NAMES as STYLES  # noqa: F401 - what --style accepts

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
    # the course's probe key (a digest of its secret, ``probe_key_of``): the probe's sizes,
    # ids and seeds are drawn from it; "" = the documented default probe
    probe_key: str = ""
    # builder: more keyword arguments of the constructor, as (name, JSON value) pairs (a
    # fork's own option); never the probe's dim, K, m, T or mlp
    init_kwargs: tuple[tuple[str, object], ...] = ()
    # builder: the class graded as MoCo when the module goes by another name (the grader's
    # decision from the source: ``probe.source.moco_like_class``); "" = MoCo
    builder_class: str = ""
    # lab: the queue capacity train_moco's source states (``probe.source.stated_capacity``) and
    # its line, for a queue that never dropped an entry; None when it states none (or pinned)
    stated_capacity: int | None = None
    stated_capacity_line: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GradeOptions:
        data = dict(data)
        data["checks"] = tuple(data.get("checks", ()))
        data["rubric"] = tuple((str(k), float(v)) for k, v in data.get("rubric", ()))
        data["init_kwargs"] = tuple((str(k), v) for k, v in data.get("init_kwargs", ()))
        return cls(**data)

    def for_the_probe(self) -> GradeOptions:
        """What the submission's process is told: everything but the course's rubric (points
        are the judge's business, never the probe's)."""
        return replace(self, rubric=())

    def selects(self, check_id: str) -> bool:
        """A whole check id, or its family: ``I1`` selects ``I1-…`` and never ``I10-…``."""
        family = family_of(check_id)
        return not self.checks or any(chosen in (check_id, family) for chosen in self.checks)


def probe_key_of(secret: str | bytes) -> str:
    """The probe key a course's secret gives (the secret itself never leaves the grader)."""
    material = secret.encode() if isinstance(secret, str) else bytes(secret)
    return hashlib.sha256(b"moco-ref probe key|" + material).hexdigest()[:32]


def course_draw(kind: str, key: str, seed: int) -> random.Random:
    """The random stream a course's probe of ``kind`` is drawn from: the same for the same
    key and seed on every machine, unrelated across kinds, keys and seeds."""
    material = f"moco-ref {kind} probe|{key}|{int(seed)}".encode()
    return random.Random(hashlib.sha256(material).digest())


def family_of(check_id: str) -> str:
    """The family a check id starts with: ``I3-fifo-keeps-newest`` is in ``I3``."""
    return check_id.split("-", 1)[0]


# --------------------------------------------------------------------------- the option table


@dataclass(frozen=True)
class OptionSpec:
    """One grading option, declared once: the ``GradeOptions`` field it sets, its flag, its
    help, its type and bounds. Every front end is generated from the table: ``moco-ref
    grade``'s and ``demo``'s flags, the rerun command a report shows, the pytest plugin's
    ``--moco-*`` options and the ``sensitivity`` command's."""

    field: str
    flag: str
    help: str
    group: str  # "judging" or "running": where the flag is listed in --help
    kind: type | None = None  # float, int or str; None: a switch
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    low: float | None = None  # the smallest value allowed
    above_low: bool = False  # ... or strictly above it
    high: float | None = None
    zero_means_none: bool = False  # ``0`` on the command line stands for None
    in_plugin: bool = False  # pytest --moco-<flag>
    in_sensitivity: bool = False  # moco-ref sensitivity --<flag>

    @property
    def default(self):
        return getattr(GradeOptions(), self.field)

    def problem(self, value) -> str:
        """"" when ``value`` (as parsed) can be used, else one line naming the flag."""
        if value is None or self.kind not in (int, float):
            return ""
        if self.zero_means_none and value == 0:
            return ""
        finite = value == value and value not in (float("inf"), float("-inf"))
        low_ok = self.low is None or (value > self.low if self.above_low else value >= self.low)
        high_ok = self.high is None or value <= self.high
        if finite and low_ok and high_ok:
            return ""
        return f"{self.flag} must be {self.bounds()}, not {_shown(value)}"

    def bounds(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.above_low else '≥'} {_shown(self.low)}")
        if self.high is not None:
            parts.append(f"≤ {_shown(self.high)}")
        text = "a number" if self.kind is float else "an integer"
        text += " " + " and ".join(parts) if parts else ""
        return text + (" (0: none)" if self.zero_means_none else "")

    def command_line(self, value) -> list[str]:
        """The flag and value that set ``value`` (nothing when it is the default)."""
        if value == self.default:
            return []
        if self.kind is None:
            return [self.flag] if value else []
        if value is None:
            return [self.flag, "0"] if self.zero_means_none else []
        return [self.flag, _shown(value)]


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("style", "--style", "skip style detection", "judging", str,
               choices=tuple(STYLES), in_plugin=True, in_sensitivity=True),
    OptionSpec("variant", "--variant",
               "builder: the loss the module must have, asymmetric (forward returns one "
               "(logits, labels) pair) or symmetric (two pairs, or a loss of two halves); "
               "detected from what forward returns when not given", "judging", str,
               choices=VARIANTS, in_plugin=True),
    OptionSpec("temperature", "--temperature",
               "T used to judge losses and logits (default %(default)s)", "judging", float,
               metavar="T", low=0.0, above_low=True, in_plugin=True),
    OptionSpec("expect_m", "--expect-m", "pin the momentum (as the assignment sets it)",
               "judging", float, metavar="M", low=0.0, high=1.0, in_plugin=True,
               in_sensitivity=True),
    OptionSpec("expect_capacity", "--expect-capacity", "pin the queue capacity", "judging",
               int, metavar="K", low=1, in_plugin=True, in_sensitivity=True),
    OptionSpec("expect_batch_size", "--expect-batch-size", "pin the batch size", "judging",
               int, metavar="B", low=1, in_plugin=True, in_sensitivity=True),
    OptionSpec("seed", "--seed", "probe seed (default %(default)s)", "judging", int,
               in_plugin=True),
    OptionSpec("timeout", "--timeout",
               "wall-clock seconds per submission (default %(default)s)", "running", float,
               metavar="S", low=0.0, above_low=True, in_plugin=True, in_sensitivity=True),
    OptionSpec("memory_mb", "--memory-mb",
               "memory of one submission's job, all its processes together (their "
               "proportional resident sets; default %(default)s); each process also has an "
               "address-space limit 4096 MB above it (torch alone maps ~3.4 GB)", "running",
               int, metavar="MB", low=64, in_plugin=True),
    OptionSpec("check_timeout", "--check-timeout",
               "wall-clock seconds for each observed part (moco_warmup, train_moco, each "
               "component); one that runs out reports its checks 'timeout' and the rest is "
               "observed in a fresh process (default %(default)s; 0 = only --timeout)",
               "running", float, metavar="S", low=0.0, zero_means_none=True, in_plugin=True),
    OptionSpec("execute_all_cells", "--execute-all-cells",
               "notebooks: run every cell, not only imports and definitions", "running",
               in_plugin=True),
    OptionSpec("allow_reference_import", "--allow-reference-import",
               "let submissions import moco_ref (refused by default: it would let a "
               "submission hand its work to the reference)", "running"),
)
OPTION_BY_FIELD = {spec.field: spec for spec in OPTIONS}


def options_problem(values: dict) -> str:
    """The first value of ``values`` (field → parsed value) that cannot be used, said in one
    line naming its flag; "" when all can."""
    for spec in OPTIONS:
        problem = spec.problem(values.get(spec.field))
        if problem:
            return problem
    return ""


def grade_options(values: dict, **others) -> GradeOptions:
    """``GradeOptions`` from parsed values (field → value; None or absent: the default)."""
    chosen = {}
    for spec in OPTIONS:
        value = values.get(spec.field)
        if spec.zero_means_none and value == 0:
            chosen[spec.field] = None
        elif value is not None and not (spec.kind is None and value is False):
            chosen[spec.field] = value
    return GradeOptions(**chosen, **others)


def command_line_of(options: GradeOptions) -> list[str]:
    """The flags that give ``options`` again (defaults left out), in the table's order."""
    return [part for spec in OPTIONS for part in spec.command_line(getattr(options, spec.field))]
