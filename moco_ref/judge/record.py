"""What every observation record must be before anything in it is believed, whatever its
style: within the wall's rule (``probe.wall.WALL.check``: plain data, bounded, dense tensors
only), and only the keys its ``probe.schema`` type names. The style-specific checks against
the probe the grader ran are in ``lab_record``, ``components_record`` and
``builder_record``; ``styles.validate_part`` runs them.

The record comes from the submission's process, which the submission controls: it can patch
the observer, empty its lists, or write a record of its own. The judge recomputes every
verdict from raw observations; validation makes sure those observations are what the grader's
own probe produces before any of them is believed:

- **structure**: every dict holds only the keys its ``probe.schema`` type names,
  every entry has the type, dtype and shape the observer writes; counts are
  bounded and consistent;
- **the probe**: the probe, the seed, the training ids, the initial parameters and the
  parameter layout are the ones the grader asked for — recomputed, not read back;
- **the forwards**: every recorded output of the probe model is recomputed from the recorded
  parameters and input: an output that no real forward of the probe model gives is a forgery
  or a corruption.
"""

from __future__ import annotations

import contextlib
import contextvars
import time

import torch

from moco_ref.probe import schema
from moco_ref.probe.wall import WallViolation


class GraderOutOfTime(RuntimeError):
    """The grader's own time for checking a record ran out (its trouble, not the
    submission's: such a report is never the student's grade)."""


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("deadline",
                                                                        default=None)


@contextlib.contextmanager
def checking_until(deadline: float | None):
    """Within the block, ``in_time()`` raises ``GraderOutOfTime`` past ``deadline``."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def in_time() -> None:
    """Called inside every validation loop: the grader checks its own deadline as it goes."""
    deadline = _DEADLINE.get()
    if deadline is not None and time.monotonic() > deadline:
        raise GraderOutOfTime("the grader's time for checking the observations ran out")


# A record the judge refuses, for the wall's rule (``probe.wall.WALL.check``) or a style's
# checks: one exception, so every ``except Invalid`` catches both.
Invalid = WallViolation


def need(condition: bool, message: str) -> None:
    if not condition:
        raise Invalid(message)

def tensor_of(value, where: str, *, dtype=None, ndim: int | None = None,
            shape: tuple | None = None) -> torch.Tensor:
    need(type(value) is torch.Tensor, f"{where} is not a tensor")
    if dtype is not None:
        need(value.dtype == dtype, f"{where} is {value.dtype}, not {dtype}")
    if ndim is not None:
        need(value.ndim == ndim, f"{where} has {value.ndim} dimensions, not {ndim}")
    if shape is not None:
        need(len(value.shape) == len(shape) and all(
            want is None or got == want for got, want in zip(value.shape, shape)),
            f"{where} has shape {list(value.shape)}, not {list(shape)}")
    return value

def integer(value, where: str, low: int | None = None) -> int:
    need(isinstance(value, int) and not isinstance(value, bool), f"{where} is not an integer")
    if low is not None:
        need(value >= low, f"{where} is {value} < {low}")
    return value

def boolean(value, where: str) -> bool:
    need(isinstance(value, bool), f"{where} is not a bool")
    return value

def entries(value, record_type: type, where: str) -> dict:
    """``value`` is a dict whose keys are all named by ``record_type`` (probe.schema)."""
    need(isinstance(value, dict), f"{where} is not a dict")
    extra = set(value) - schema.keys_of(record_type)
    need(not extra, f"{where} has entries the observer never writes: "
                     f"{sorted(map(str, extra))[:5]}")
    return value

def text_or_none(value, where: str) -> None:
    need(value is None or isinstance(value, str), f"{where} is neither text nor None")

def validate_warmup(data) -> None:
    entries(data, schema.WarmupRecord, "moco_warmup's record")
    boolean(data.get("defined"), "moco_warmup.defined")
    text_or_none(data.get("error"), "moco_warmup.error")
