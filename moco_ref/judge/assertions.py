"""The harness's assertion helpers: every failure reads the same way.

    <misconception>: <where> expected <expected>, got <got>

e.g. "queue kept the oldest keys: after step 8 (ids 12, 40, 77, … 30 in all) expected the
last 240 keys (arrivals 210–449), got the first 240 (arrivals 0–239)". The misconception
comes first, so a reader knows what to fix before reading numbers; the evidence names the
step and the source ids, so nobody needs a debugger to find the moment it went wrong.

A check raises ``CheckFailure`` (failed), ``NotJudged`` (a precondition judged by another
check failed), ``NotExercised`` (the submission never reached the situation the check is
about: not judged either, never passed) or ``SubmissionError`` (the submission raised or the
grader could not follow it: an error).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NoReturn

import torch


class CheckFailure(AssertionError):
    """A check found the invariant broken."""

    def __init__(
        self,
        misconception: str,
        *,
        expected: object = None,
        got: object = None,
        where: str = "",
        details: dict | None = None,
    ) -> None:
        self.misconception = misconception
        self.expected = expected
        self.got = got
        self.where = where
        self.details = dict(details or {})
        super().__init__(self.message)

    @property
    def message(self) -> str:
        evidence = ""
        if self.expected is not None or self.got is not None:
            evidence = f"expected {self.expected}, got {self.got}"
        if self.where:
            evidence = f"{self.where} {evidence}".strip()
        return f"{self.misconception}: {evidence}" if evidence else self.misconception


class NotExercised(Exception):
    """The probe did not reach the situation the check is about (reported as not applicable)."""


class NotRequired(Exception):
    """The style's protocol makes the part this check reads optional and the submission left it
    out (reported as not applicable)."""


class Note(str):
    """A check's message on a pass that also holds machine-readable evidence (``details``)."""

    details: dict

    def __new__(cls, text: str, details: dict) -> Note:
        note = super().__new__(cls, text)
        note.details = dict(details)
        return note


class NotJudged(Exception):
    """A precondition another check judges failed, so this one cannot be judged: reported
    "not judged: needs <check>", without points, the other check carrying the explanation."""

    def __init__(self, needs: str, reason: str) -> None:
        self.needs = needs
        self.reason = reason
        super().__init__(f"not judged: needs {needs} ({reason})")


class SubmissionError(Exception):
    """The submission raised, or did something the grader cannot follow (reported as error)."""


class SubmissionCrashed(SubmissionError):
    """A part of the submission (``train_moco``, ``moco_warmup``, the module) raised: told once,
    in full, by the first check that needs it; every later check that needs it is "not run"
    with the one-line ``summary``."""

    def __init__(self, part: str, summary: str, text: str) -> None:
        self.part = part
        self.summary = summary  # "train_moco raised at step 5 (epoch 1, batch 2 of the epoch)"
        if _MEMORY_ERROR.search(text or ""):  # the limit it met is the grader's: say which
            text = f"{text.rstrip()}\n{OUT_OF_MEMORY}"
        super().__init__(f"{summary}:\n{text}" if text else summary)


_MEMORY_ERROR = re.compile(r"^\s*MemoryError\b", re.MULTILINE)
OUT_OF_MEMORY = ("(a MemoryError: the submission's process reached the memory each job may "
                 "use, --memory-mb)")


# --------------------------------------------------------------------------- formatting


def fmt_ids(ids: Iterable[int] | torch.Tensor, limit: int = 6) -> str:
    """``12, 40, 77, … 30 in all`` (or all of them when few)."""
    values = [int(v) for v in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
    if len(values) <= limit:
        return "[" + ", ".join(map(str, values)) + "]"
    return "[" + ", ".join(map(str, values[:limit])) + f", … {len(values)} in all]"


def fmt_values(values: Iterable[float] | torch.Tensor, limit: int = 6, digits: int = 4) -> str:
    flat = values.flatten().tolist() if isinstance(values, torch.Tensor) else list(values)
    shown = ", ".join(_fmt_number(v, digits) for v in flat[:limit])
    return f"[{shown}{', …' if len(flat) > limit else ''}]"


def _fmt_number(value: object, digits: int) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return repr(value)


def fmt_range(values: torch.Tensor | list[int]) -> str:
    """``210–449`` for a run of consecutive integers, else a short list."""
    flat = [int(v) for v in (values.tolist() if isinstance(values, torch.Tensor) else values)]
    if flat and flat == list(range(flat[0], flat[0] + len(flat))):
        return f"{flat[0]}–{flat[-1]}" if len(flat) > 1 else str(flat[0])
    return fmt_ids(flat)


def at_step(step: int | None, ids: torch.Tensor | None = None, *, after: bool = False) -> str:
    """``at step 5 (ids [3, 17, …])`` — steps count from 0, as in LAB 07's trace."""
    if step is None:
        return ""
    text = f"{'after' if after else 'at'} step {step}"
    if ids is not None and len(ids):
        text += f" (ids {fmt_ids(ids)})"
    return text


# --------------------------------------------------------------------------- assertions


def fail(
    misconception: str,
    *,
    expected: object = None,
    got: object = None,
    where: str = "",
    details: dict | None = None,
) -> NoReturn:
    raise CheckFailure(misconception, expected=expected, got=got, where=where, details=details)


def require(
    condition: bool,
    misconception: str,
    *,
    expected: object = None,
    got: object = None,
    where: str = "",
    details: dict | None = None,
) -> None:
    if not condition:
        fail(misconception, expected=expected, got=got, where=where, details=details)


def assert_close(
    actual: torch.Tensor | float | list,
    expected: torch.Tensor | float | list,
    misconception: str,
    *,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    where: str = "",
    details: dict | None = None,
) -> None:
    """Elementwise ``|actual − expected| ≤ atol + rtol·|expected|``; the message shows both
    and the largest difference."""
    got = torch.as_tensor(actual, dtype=torch.float64)
    want = torch.as_tensor(expected, dtype=torch.float64)
    if got.shape != want.shape:
        fail(misconception, expected=f"shape {list(want.shape)}", got=f"shape {list(got.shape)}",
             where=where, details=details)
    if not torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=False):
        difference = float((got - want).abs().max()) if got.numel() else 0.0
        fail(misconception, expected=fmt_values(want), got=f"{fmt_values(got)} "
             f"(largest difference {difference:.3g})", where=where, details=details)


def assert_equal(
    actual: object,
    expected: object,
    misconception: str,
    *,
    where: str = "",
    details: dict | None = None,
) -> None:
    """Exact equality (tensors by ``torch.equal``)."""
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        a, e = torch.as_tensor(actual), torch.as_tensor(expected)
        same = a.shape == e.shape and torch.equal(a, e.to(a.dtype))
        shown = (fmt_ids(a), fmt_ids(e)) if not a.is_floating_point() else (fmt_values(a),
                                                                             fmt_values(e))
    else:
        same = actual == expected
        shown = (repr(actual), repr(expected))
    require(same, misconception, expected=shown[1], got=shown[0], where=where, details=details)


def describe_value(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {list(value.shape)}"
    if isinstance(value, dict) and "__type__" in value:
        return f"a {value['__type__']}"
    return f"a {type(value).__name__}"
