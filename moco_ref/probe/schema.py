"""The shape of an observation record: one ``TypedDict`` per entry the observers write.

The observing side builds these (``observers``, ``lab_probe``, ``builder_probe``); the judging
side reads them (``judge.record`` refuses any entry a schema here does not name, then
``judge``'s evidence modules read them). A key is spelled here once; a
type checker holds writers and readers to it, and ``keys_of`` gives the validator the same
set at run time.
"""

from __future__ import annotations

from typing import Any, TypedDict

try:  # the observer side may run without torch's stubs being importable as types
    from torch import Tensor
except ImportError:  # pragma: no cover - torch is a dependency of every observer
    Tensor = Any  # type: ignore[misc,assignment]


def keys_of(schema: type) -> frozenset[str]:
    """Every key a record entry of this schema may hold."""
    keys: set[str] = set()
    for klass in reversed(schema.__mro__):
        keys.update(getattr(klass, "__annotations__", {}))
    return frozenset(keys)


# --------------------------------------------------------------------------- shared


class ObservedRecord(TypedDict, total=False):
    """What ``observers.observe`` adds to every style's record."""

    format: int  # observers.OBSERVATION_FORMAT
    style: str


class WarmupRecord(TypedDict):
    """``moco_warmup()``'s answer (lab and components)."""

    defined: bool
    error: str | None
    result: Any  # sanitised plain data


class CaseError(TypedDict):
    """A component case that raised."""

    error: str


# --------------------------------------------------------------------------- lab


class ForwardEvent(TypedDict):
    """One forward of a probe model copy inside ``train_moco``."""

    instance: int  # which copy of the probe model ran
    clock: int
    view_calls: int  # how many ``views`` calls had happened
    rows_call: Tensor  # [B] the view call of each input row (−1 raw image, −2 untraced)
    rows_id: Tensor  # [B] the source id of each row (−1 untraced)
    grad_enabled: bool
    output_requires_grad: bool
    output_has_grad_fn: bool
    output: Tensor  # [B, 24]
    snapshot_tags: list[int]
    params: list[Tensor]  # [P] per snapshotted copy
    has_grad: list[bool]
    grad: Tensor | None  # [B, 24] the gradient that reached the output
    grad_clock: int
    grad_calls: int
    own_grad: Tensor | None  # [P] this copy's parameters' .grad when the forward ran


class Returned(TypedDict, total=False):
    """What ``train_moco`` returned, described and converted to plain data."""

    type: str
    length: int | None
    items: list[dict]
    query_instance: int
    key_instance: int
    query_params: Tensor  # [P]
    key_params: Tensor  # [P]
    query_grads_none: list[bool]
    key_grads_none: list[bool]
    query_requires_grad: list[bool]
    key_requires_grad: list[bool]
    queue: Any
    queue_ids: Any
    history: Any
    trace: Any
    drift: Any


class TrainingRecord(TypedDict, total=False):
    """``train_moco`` run on the lab probe."""

    defined: bool
    error: str | None
    layout: list[dict]
    initial_params: Tensor  # [P]
    train: Tensor  # [N] training ids
    projection_dim: int
    seconds: float
    events: list[ForwardEvent]
    dropped_events: int
    view_calls: list[Tensor]  # [B_c] ids per ``views`` call
    instances: int
    initial_unchanged: bool
    returned: Returned
    input_mutated: bool  # parts.INPUT_MUTATED: the probe's images changed in place
    short_run: TrainingRecord  # the same run on cases.short_lab_probe (main record only)


class LabRecord(ObservedRecord, total=False):
    probe: dict
    probe_dtype: str  # parts.PROBE_DTYPE
    moco_warmup: WarmupRecord
    train_moco: TrainingRecord


# --------------------------------------------------------------------------- components


class QueueCaseOutput(TypedDict):
    keys: list[Tensor]  # [K, D] after each enqueue
    ids: list[Tensor]  # [K] after each enqueue
    len: list[int]


class EmaCaseOutput(TypedDict):
    key_params: list[Tensor]
    key_buffers: list[Tensor]
    key_grads_none: list[bool]
    key_grad_fn: list[bool]
    query_unchanged: bool


class LogitsCaseOutput(TypedDict):
    logits: Tensor  # [B, 1 + K] float64


class LossCaseOutput(TypedDict):
    loss: float


CASE_OUTPUTS: dict[str, type] = {
    "queue": QueueCaseOutput,
    "ema": EmaCaseOutput,
    "logits": LogitsCaseOutput,
    "loss": LossCaseOutput,
}


class ComponentsRecord(ObservedRecord, total=False):
    seed: int
    defined: dict[str, bool]
    fingerprints: dict[str, str]
    moco_warmup: WarmupRecord
    queue: list[QueueCaseOutput | CaseError] | None
    ema: list[EmaCaseOutput | CaseError] | None
    logits: list[LogitsCaseOutput | CaseError] | None
    loss: list[LossCaseOutput | CaseError] | None


# --------------------------------------------------------------------------- builder


class EncoderParameters(TypedDict):
    params_q: Tensor | None  # [P]
    params_k: Tensor | None  # [P]


class BuilderState(EncoderParameters):
    queue: Tensor | None  # [dim, K]
    queue_ptr: Tensor | None  # [1]


class BuilderForward(EncoderParameters):
    role: str  # "q", "k" or "other"
    grad_enabled: bool
    has_grad_fn: bool
    training: bool  # the encoder's mode (BatchNorm from the batch, not running statistics)
    probe_encoder: bool  # the grader's ProbeEncoder (or a copy of it), so recomputable
    output: Tensor  # [n, dim]
    views: Tensor  # [n] which view each row came from
    rows: Tensor  # [n] which image of the batch


class BuilderStep(TypedDict, total=False):
    before: BuilderState
    events: list[BuilderForward]
    returned: dict
    logits: Tensor  # [B, 1 + K]
    labels: Tensor  # [B]
    pairs: list[dict]  # a symmetric module: [{"logits", "labels"}] × 2, in computation order
    loss_returned: bool  # forward returned a loss (its pairs were captured), trained on as is
    after_forward: BuilderState
    key_grads: list[bool]
    loss: float
    after_step: EncoderParameters


# the constructed module's structure ("class" is a keyword: the functional form spells it)
BuilderModule = TypedDict("BuilderModule", {
    "class": str,
    "factory_calls": list[dict],
    "buffers": list[str],
    "queue": dict,
    "queue_ptr": dict,
    "attributes": "dict[str, float | None]",
    "encoder_names": list[str],  # what the module calls its query and key encoders
    "encoder_q": bool,
    "encoder_k": bool,
    "encoder_q_probe": bool,
    "encoder_k_probe": bool,
    "layout_q": list[dict],
    "layout_k": list[dict],
    "requires_grad_q": list[bool],
    "requires_grad_k": list[bool],
    "fc_q": list[str],
    "fc_k": list[str],
    "fc_linear_q": list[list[int]],  # [in_features, out_features] of each Linear in .fc
    "fc_linear_k": list[list[int]],
}, total=False)


class BuilderRun(TypedDict, total=False):
    mlp: bool
    error: str | None
    stage: str  # "construct", "optimizer", "step t", "done" or "no mlp option"
    crashed_in: str  # at a step's error: the encoder whose forward raised, "q", "k" or ""
    steps: list[BuilderStep]
    module: BuilderModule
    initial: BuilderState


class BuilderRanks(TypedDict, total=False):
    world: int
    runs: list[BuilderRun]  # by rank; its steps' forwards traced to world-batch rows
    error: str | None  # why a rank's run is missing (it then is not judged)


class DefaultsStep(TypedDict, total=False):
    """One step of the run at the constructor's defaults: only what its EMA and its enqueue
    need (the queue is too large to copy whole)."""

    params_q: Tensor  # [P] θq as the step began
    params_k: Tensor  # [P] θk as the step began
    keys: Tensor  # [B, dim] the key encoder's outputs, as it gave them
    ptr_before: int
    changed_count: int  # the queue's columns the step changed


class DefaultsRun(TypedDict, total=False):
    """The module built at its own defaults (``MoCo(base_encoder)``) and trained a few steps."""

    error: str | None
    stage: str
    defaults: dict  # the constructor's own numeric defaults of dim, K, m and T
    K: int  # the queue's columns and rows, as built
    dim: int
    batch: int
    steps: list[DefaultsStep]


class BuilderRecord(ObservedRecord, total=False):
    probe: dict
    defined: bool
    error: str | None
    environment: dict
    run: BuilderRun
    mlp: BuilderRun
    ragged: BuilderRun  # K not a multiple of the batch
    ranks: BuilderRanks  # the two-process run
    defaults: DefaultsRun  # built at the constructor's defaults (K, dim, m, T)
