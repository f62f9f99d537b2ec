"""I2 and I3 on a module's queue *buffer* (the official ``queue`` ``[dim, K]`` and
``queue_ptr``), on plain tensors.

Every column of the buffer carries a *label*: its arrival number in the FIFO sense. The K
columns the module starts with are the oldest arrivals ``0 … K − 1`` (read from the initial
``queue_ptr`` on), and the keys of step t are ``K + t·B … K + t·B + B − 1``. After each step,
``trace_columns`` finds what every column is a copy of — a column of the buffer before the
step (bitwise, or only approximately: it was changed), or one of the step's new vectors (the
keys, normalized or raw, or the queries) — so the labels follow the columns whatever the
storage layout. What a FIFO must hold is the reference's rule: ``fifo_contents`` runs the
labels through ``KeyQueue``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from moco_ref.core.queue import KeyQueue
from moco_ref.judge.invariants.fifo import fifo_contents, match_rows

COPY_ATOL = 1e-5  # a column is a copy of a recorded vector within this max-abs distance
KEPT, CHANGED, UNKNOWN = "kept", "changed", "unknown"


def _full_ring(labels: torch.Tensor, ptr: int) -> KeyQueue:
    """The reference queue over a full ring whose id slots are ``labels`` (written in place)."""
    return KeyQueue.over_storage(torch.zeros(len(labels), 1, dtype=torch.float64), labels,
                                 int(ptr), len(labels))


def initial_labels(capacity: int, ptr: int) -> torch.Tensor:
    """``[K]`` labels of the starting columns: what the reference ring writes when arrivals
    ``0 … K−1`` are enqueued at ``ptr`` (column ``(ptr + i) % K`` holds arrival ``i``)."""
    labels = torch.zeros(capacity, dtype=torch.int64)
    _full_ring(labels, ptr).enqueue(torch.zeros(capacity, 1, dtype=torch.float64),
                                    torch.arange(capacity))
    return labels


def pointer_after(capacity: int, ptr: int, batch: int) -> int:
    """Where the reference ring's pointer is after enqueueing ``batch`` keys at ``ptr``."""
    ring = _full_ring(torch.zeros(capacity, dtype=torch.int64), ptr)
    ring.enqueue(torch.zeros(batch, 1, dtype=torch.float64), torch.zeros(batch, dtype=torch.int64))
    return ring.ptr


def arrival_labels(capacity: int, batch: int, step: int) -> torch.Tensor:
    """``[B]`` labels of the keys of ``step``."""
    return capacity + step * batch + torch.arange(batch, dtype=torch.int64)


def expected_fifo(capacity: int, batch: int, steps: int) -> torch.Tensor:
    """``[K]`` labels a FIFO of ``capacity`` holds after ``steps`` batches, oldest first: the
    reference ``KeyQueue`` fed the starting columns, then each step's keys."""
    batches = [torch.arange(capacity, dtype=torch.int64)]
    batches += [arrival_labels(capacity, batch, t) for t in range(steps)]
    return fifo_contents(batches, capacity)[-1]


@dataclass
class ColumnTrace:
    """What each column of the buffer after a step is a copy of."""

    labels: torch.Tensor  # [K] arrival label (−1 unknown)
    kinds: list[str]  # per column: "kept", "changed" (≈ an old column, not bitwise), a kind
    #                   of new vector ("key", "raw key", "query", "raw query"), "unknown"
    distance: torch.Tensor  # [K] max-abs distance to what it was matched with


def trace_columns(
    before: torch.Tensor,
    before_labels: torch.Tensor,
    after: torch.Tensor,
    arrivals: Mapping[str, torch.Tensor],
    step_labels: torch.Tensor,
    *,
    atol: float = COPY_ATOL,
) -> ColumnTrace:
    """Label the columns of ``after`` (``[K, dim]``, one row per buffer column) from those of
    ``before`` (``[K, dim]``, labelled ``before_labels`` ``[K]``) and the step's new vectors
    (``arrivals``: kind → ``[B, dim]``, row i labelled ``step_labels[i]``).

    A bitwise copy of an old column keeps its label; otherwise a new vector within ``atol``
    labels it by kind (in the order of ``arrivals``); otherwise an old column within
    ``atol`` (changed, not bitwise); otherwise unknown."""
    before = before.to(torch.float64)
    after = after.to(torch.float64)
    n = after.shape[0]
    labels = torch.full((n,), -1, dtype=torch.int64)
    kinds = [UNKNOWN] * n
    distance = torch.full((n,), float("inf"), dtype=torch.float64)

    exact, gap = match_rows(after, before, atol=0.0)
    for j in (exact >= 0).nonzero().flatten().tolist():
        labels[j], kinds[j], distance[j] = before_labels[exact[j]], KEPT, 0.0
    for kind, vectors in arrivals.items():
        rest = [j for j in range(n) if kinds[j] == UNKNOWN]
        if not rest:
            break
        index, gap = match_rows(after[rest], vectors.to(torch.float64), atol=atol)
        for j, i, d in zip(rest, index.tolist(), gap.tolist()):
            if i >= 0:
                labels[j], kinds[j], distance[j] = step_labels[i], kind, d
    rest = [j for j in range(n) if kinds[j] == UNKNOWN]
    if rest:
        index, gap = match_rows(after[rest], before, atol=atol)
        for j, i, d in zip(rest, index.tolist(), gap.tolist()):
            if i >= 0:
                labels[j], kinds[j], distance[j] = before_labels[i], CHANGED, d
    return ColumnTrace(labels, kinds, distance)


def oldest_first(labels: torch.Tensor, ptr: int) -> torch.Tensor:
    """The buffer's labels read as the reference reads a full ring: from the slot ``ptr`` on
    (where its oldest entry is)."""
    return _full_ring(labels.to(torch.int64).clone(), ptr).ids
