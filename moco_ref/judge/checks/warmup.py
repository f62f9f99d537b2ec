"""The shape of ``moco_warmup``'s result (its values are I5's), and the helpers that read it."""

from __future__ import annotations

import torch

from moco_ref.judge.assertions import (
    NotRequired,
    SubmissionCrashed,
    describe_value,
    fail,
    require,
)
from moco_ref.judge.registry import check


def warmup_result(ev) -> dict:
    record = ev.warmup or {}
    if not record.get("defined", False):
        if getattr(ev, "style", "lab") == "components":
            raise NotRequired("moco_warmup is not defined (optional in the components protocol)")
        fail("moco_warmup is not defined", expected="a function moco_warmup() -> dict",
             got="no such name")
    if record.get("error"):
        raise SubmissionCrashed("moco_warmup", "moco_warmup() raised", record["error"])
    result = record.get("result")
    require(isinstance(result, dict), "moco_warmup() must return a dict",
            expected="{'temperature_probabilities': …, 'FIFO': …, 'EMA': …}",
            got=describe_value(result))
    return result


def warmup_entry(ev, key: str):
    result = warmup_result(ev)
    require(key in result, f"moco_warmup() has no {key!r} entry",
            expected=f"keys {sorted(['temperature_probabilities', 'FIFO', 'EMA'])}",
            got=f"keys {sorted(result)}")
    return result[key]


def numbers_or_none(value) -> list[float] | None:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                       for v in value):
        return [float(v) for v in value]
    return None


RETURNS_STRUCTURE = check(
    "warmup-returns-structure",
    "moco_warmup returns the documented dict",
    points=1,
    contract=(
        "moco_warmup() returns {'temperature_probabilities': {'0.1': [3 probabilities], '0.5': "
        "[...]}, 'FIFO': [letters], 'EMA': [numbers]}."
    ),
)


@RETURNS_STRUCTURE.judges('lab', 'components')
def warmup_returns_structure(ev) -> str | None:
    """``moco_warmup()`` returns ``{'temperature_probabilities': {'0.1': [3 floats], '0.5':
    [3 floats]}, 'FIFO': [4 letters], 'EMA': [2 floats]}``."""
    result = warmup_result(ev)
    probabilities = warmup_entry(ev, "temperature_probabilities")
    require(isinstance(probabilities, dict) and sorted(probabilities) == ["0.1", "0.5"],
            "temperature_probabilities must map '0.1' and '0.5' to probabilities",
            expected="keys ['0.1', '0.5']", got=describe_value(probabilities)
            if not isinstance(probabilities, dict) else f"keys {sorted(probabilities)}")
    for t, values in probabilities.items():
        numbers = numbers_or_none(values)
        require(numbers is not None and len(numbers) == 3,
                f"temperature_probabilities[{t!r}] must be 3 probabilities",
                expected="a list of 3 floats", got=describe_value(values))
    fifo = warmup_entry(ev, "FIFO")
    require(isinstance(fifo, list) and all(isinstance(v, str) for v in fifo),
            "FIFO must be a list of letters", expected="a list of 4 strings",
            got=describe_value(fifo))
    ema = numbers_or_none(warmup_entry(ev, "EMA"))
    require(ema is not None and len(ema) == 2, "EMA must be a list of 2 numbers",
            expected="a list of 2 floats", got=describe_value(result.get("EMA")))
    return None
