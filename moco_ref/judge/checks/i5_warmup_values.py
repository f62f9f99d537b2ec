"""I5: the warm-up values come out as LAB 07 expects."""

from __future__ import annotations

import math

import torch

from moco_ref.core.contrastive import contrastive_logits
from moco_ref.core.warmup import WARMUP_KEYS, WARMUP_QUERY
from moco_ref.core.warmup import moco_warmup as reference_warmup
from moco_ref.judge.assertions import (
    describe_value,
    fail,
    fmt_values,
    require,
)
from moco_ref.judge.checks.warmup import numbers_or_none, warmup_entry
from moco_ref.judge.registry import check


def _warmup_probabilities(temperature: float, *, normalize: bool = True, multiply: bool = False):
    q = torch.tensor([WARMUP_QUERY], dtype=torch.float64)
    keys = torch.tensor(WARMUP_KEYS, dtype=torch.float64)
    if normalize:
        keys = torch.nn.functional.normalize(keys, dim=1)
    t = 1.0 / temperature if multiply else temperature
    return contrastive_logits(q, keys[:1], keys[1:], None, None, t).softmax(dim=1)[0].tolist()


FIFO_LETTERS = check(
    "I5-fifo-letters",
    "the warm-up FIFO keeps ['c', 'd', 'e', 'f']",
    points=1,
    contract=(
        "The warm-up FIFO (a 4-slot queue fed a, b, c, d, e, f) keeps ['c', 'd', 'e', 'f']."
    ),
)


@FIFO_LETTERS.judges('lab', 'components')
def i5_fifo_letters(ev) -> str | None:
    """A 4-slot queue holding a, b, c, d that receives e, f holds c, d, e, f (the reference's
    ``KeyQueue`` computes the expected letters)."""
    expected = reference_warmup()["FIFO"]
    got = warmup_entry(ev, "FIFO")
    if got == expected:
        return None
    diagnosis = {
        ("a", "b", "c", "d"): "the warm-up queue kept the oldest letters",
        ("e", "f", "c", "d"): "the warm-up queue overwrote slots without rotating to oldest first",
        ("f", "e", "d", "c"): "the warm-up queue is newest first",
        ("e", "f", "a", "b"): "the warm-up queue put new letters in front",
        ("a", "b", "c", "d", "e", "f"): "the warm-up queue never dropped the oldest letters",
    }.get(tuple(got) if isinstance(got, list) else (), "the warm-up FIFO is wrong")
    fail(diagnosis, where="after enqueueing ['e', 'f'] into ['a', 'b', 'c', 'd'] with capacity 4",
         expected=expected, got=got)


EMA_VALUES = check(
    "I5-ema-values",
    "the warm-up EMA gives [0.2, 2.2]",
    points=1,
    contract=(
        "The warm-up EMA, θk = (0, 2) following θq = (2, 4) with m = 0.9, gives [0.2, 2.2]."
    ),
)


@EMA_VALUES.judges('lab', 'components')
def i5_ema_values(ev) -> str | None:
    """θk = (0, 2) following θq = (2, 4) with m = 0.9 gives (0.2, 2.2) (the reference's
    ``momentum_update`` computes it)."""
    expected = reference_warmup()["EMA"]
    got = numbers_or_none(warmup_entry(ev, "EMA"))
    require(got is not None and len(got) == 2, "EMA must be a list of 2 numbers",
            expected=fmt_values(expected), got=describe_value(warmup_entry(ev, "EMA")))
    if all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(got, expected)):
        return None
    diagnosis = "the warm-up EMA is wrong"
    for values, text in (([1.8, 3.8], "the EMA coefficients are swapped (0.1·θk + 0.9·θq)"),
                         ([0.0, 2.0], "the EMA did not move θk"),
                         ([2.0, 4.0], "the EMA copied θq (m = 0)")):
        if all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(got, values)):
            diagnosis = text
    fail(diagnosis, where="for θk = (0, 2), θq = (2, 4), m = 0.9", expected=fmt_values(expected),
         got=fmt_values(got))


TEMPERATURE_PROBABILITIES = check(
    "I5-temperature-probabilities",
    "the warm-up softmax over q·k/T is right for T = 0.1, 0.5",
    points=1,
    contract=(
        "The warm-up probabilities are the softmax of q·k/T over the positive and the "
        "negatives, for T = 0.1 and T = 0.5."
    ),
)


@TEMPERATURE_PROBABILITIES.judges('lab', 'components')
def i5_temperature_probabilities(ev) -> str | None:
    """For q = (1, 0) and the normalized keys (0.8, 0.2), (0, 1), (−1, 0), the probabilities
    are softmax(q·k/T) for T = 0.1 and T = 0.5 (recomputed with ``contrastive_logits``)."""
    probabilities = warmup_entry(ev, "temperature_probabilities")
    require(isinstance(probabilities, dict), "temperature_probabilities must be a dict",
            expected="{'0.1': [...], '0.5': [...]}", got=describe_value(probabilities))
    expected_all = reference_warmup()["temperature_probabilities"]
    for t, expected in expected_all.items():
        require(t in probabilities, f"temperature_probabilities has no {t!r} entry",
                expected=f"keys {sorted(expected_all)}", got=f"keys {sorted(probabilities)}")
        got = numbers_or_none(probabilities[t])
        if got is not None and len(got) == 3 and all(
                math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(got, expected)):
            continue
        diagnosis = f"the warm-up probabilities for T = {t} are wrong"
        if got is not None and len(got) == 3:
            for values, text in (
                (_warmup_probabilities(float(t), multiply=True),
                 "the scores were multiplied by T instead of divided"),
                (_warmup_probabilities(float(t), normalize=False),
                 "the keys were not L2-normalized"),
                (_warmup_probabilities(1.0), "the temperature was not applied"),
            ):
                if all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(got, values)):
                    diagnosis = f"{text} (T = {t})"
        fail(diagnosis, where=f"for T = {t}", expected=fmt_values(expected, digits=6),
             got=fmt_values(got, digits=6) if got is not None else describe_value(
                 probabilities[t]))
    return None
