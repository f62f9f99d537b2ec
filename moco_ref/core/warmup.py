"""LAB 07's warm-up numbers, computed with the reference's own components (invariant I5).

- temperature: a query q = (1, 0) and three normalized candidate keys (0.8, 0.2), (0, 1),
  (−1, 0); the softmax of q·k/T for T = 0.1 and T = 0.5;
- FIFO: a 4-slot queue holding a, b, c, d receives e, f and keeps c, d, e, f;
- EMA: θk = (0, 2) follows θq = (2, 4) with m = 0.9 to (0.2, 2.2).
"""

from __future__ import annotations

import torch
from torch import nn

from moco_ref.core.contrastive import contrastive_logits
from moco_ref.core.momentum import momentum_update
from moco_ref.core.queue import KeyQueue

WARMUP_TEMPERATURES = (0.1, 0.5)
WARMUP_QUERY = (1.0, 0.0)
WARMUP_KEYS = ((0.8, 0.2), (0.0, 1.0), (-1.0, 0.0))
WARMUP_QUEUE, WARMUP_ARRIVALS, WARMUP_CAPACITY = ("a", "b", "c", "d"), ("e", "f"), 4
WARMUP_KEY_PARAMS, WARMUP_QUERY_PARAMS, WARMUP_MOMENTUM = (0.0, 2.0), (2.0, 4.0), 0.9


def _candidate_probabilities(temperature: float) -> list[float]:
    q = torch.tensor([WARMUP_QUERY], dtype=torch.float64)  # [1, 2]
    keys = torch.nn.functional.normalize(torch.tensor(WARMUP_KEYS, dtype=torch.float64), dim=1)
    # Candidate 0 plays the positive, the other two the dictionary.
    logits = contrastive_logits(q, keys[:1], keys[1:], None, None, temperature)  # [1, 3]
    return logits.softmax(dim=1)[0].tolist()


def _fifo_letters() -> list[str]:
    letters = WARMUP_QUEUE + WARMUP_ARRIVALS
    queue = KeyQueue(WARMUP_CAPACITY, dim=1, dtype=torch.float64)
    for batch in (WARMUP_QUEUE, WARMUP_ARRIVALS):
        ids = torch.tensor([letters.index(letter) for letter in batch])
        queue.enqueue(ids[:, None].to(torch.float64), ids)
    return [letters[i] for i in queue.ids.tolist()]


def _ema_params() -> list[float]:
    def holder(values: tuple[float, ...]) -> nn.Module:
        module = nn.Module()
        module.theta = nn.Parameter(torch.tensor(values, dtype=torch.float64))
        return module

    key, query = holder(WARMUP_KEY_PARAMS), holder(WARMUP_QUERY_PARAMS)
    momentum_update(key, query, WARMUP_MOMENTUM)
    return key.theta.detach().tolist()


def moco_warmup() -> dict:
    """``{'temperature_probabilities': {'0.1': [p1, p2, p3], '0.5': [...]},
    'FIFO': ['c', 'd', 'e', 'f'], 'EMA': [0.2, 2.2]}``"""
    return {
        "temperature_probabilities": {
            str(t): _candidate_probabilities(t) for t in WARMUP_TEMPERATURES
        },
        "FIFO": _fifo_letters(),
        "EMA": _ema_params(),
    }
