"""I2 and I3 on plain tensors: what a FIFO dictionary holds, and what a queue's entries are.

Batches are 1-d int64 tensors of *labels* — arrival numbers (0, 1, 2, … in enqueue order) or
source ids. ``fifo_contents`` runs them through the reference's ``KeyQueue``, so the FIFO
rule is the reference's and is not written a second time here. The other rules are the
misconceptions a queue is compared against when it is not a FIFO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from moco_ref.core.queue import KeyQueue
from moco_ref.probe.cases import arrival_numbers  # noqa: F401 - one numbering for both sides


def fifo_contents(batches: Sequence[torch.Tensor], capacity: int) -> list[torch.Tensor]:
    """The labels a FIFO of ``capacity`` holds after each enqueue, oldest first ``[≤ capacity]``.

    Labels ride in the reference queue's id slots (exact for any int64), so this is
    ``KeyQueue``'s own rule: the last ``capacity`` labels in arrival order.
    """
    queue = KeyQueue(capacity, dim=1, dtype=torch.float64)
    contents = []
    for batch in batches:
        labels = torch.as_tensor(batch, dtype=torch.int64).reshape(-1)
        queue.enqueue(labels[:, None].to(torch.float64), labels)
        contents.append(queue.ids)
    return contents


def _keeps_oldest(batches: Sequence[torch.Tensor], capacity: int) -> list[torch.Tensor]:
    """Misconception: slicing the front, ``cat([queue, new])[:capacity]`` — the queue fills
    once and never changes again."""
    held, contents = torch.empty(0, dtype=torch.int64), []
    for batch in batches:
        held = torch.cat([held, torch.as_tensor(batch, dtype=torch.int64)])[:capacity]
        contents.append(held)
    return contents


def _newest_first(batches: Sequence[torch.Tensor], capacity: int) -> list[torch.Tensor]:
    """Misconception: prepending, ``cat([new, queue])[:capacity]`` — the right keys, newest
    batch first."""
    held, contents = torch.empty(0, dtype=torch.int64), []
    for batch in batches:
        held = torch.cat([torch.as_tensor(batch, dtype=torch.int64), held])[:capacity]
        contents.append(held)
    return contents


QueueRule = Callable[[Sequence[torch.Tensor], int], list]
QUEUE_RULES: dict[str, QueueRule] = {
    "fifo": fifo_contents,
    "keeps-oldest": _keeps_oldest,
    "newest-first": _newest_first,
}


def queue_contents(rule: str, batches: Sequence[torch.Tensor], capacity: int) -> list[torch.Tensor]:
    """The labels held after each enqueue under ``rule`` (a key of ``QUEUE_RULES``)."""
    return QUEUE_RULES[rule](batches, capacity)


def identify_queue_rule(
    observed: torch.Tensor, batches: Sequence[torch.Tensor], capacity: int
) -> str | None:
    """The first rule of ``QUEUE_RULES`` whose final contents equal ``observed`` ``[n]``."""
    observed = torch.as_tensor(observed, dtype=torch.int64)
    for name, rule in QUEUE_RULES.items():
        final = rule(batches, capacity)[-1] if batches else torch.empty(0, dtype=torch.int64)
        if final.shape == observed.shape and torch.equal(final, observed):
            return name
    return None


def through_one_buffer(
    slots: torch.Tensor, batches: Sequence[torch.Tensor], enqueues: int
) -> torch.Tensor:
    """Misconception (I2): every entry is a view of one reused tensor — a slice of a
    preallocated buffer written with ``copy_``, an ``out=`` tensor — not a copy, so an entry
    shows row r of the newest batch that had a row r, whichever batch filled its slot.

    ``slots`` ``[n]`` are the arrival labels the queue's slots were filled with; returns the
    labels ``[n]`` its entries show after ``enqueues`` enqueues of ``batches``.
    """
    newest: dict[int, int] = {}  # row → label of the newest batch with that row
    row_of: dict[int, int] = {}
    for number, batch in enumerate(batches):
        for row, label in enumerate(torch.as_tensor(batch).tolist()):
            row_of[label] = row
            if number < enqueues:
                newest[row] = label
    return torch.tensor([newest[row_of[label]] for label in torch.as_tensor(slots).tolist()],
                        dtype=torch.int64)


def rotation_of(observed: torch.Tensor, expected: torch.Tensor) -> int | None:
    """``s`` (0 < s < n) such that ``observed == expected.roll(s)``: a ring buffer returned in
    storage order instead of oldest first. None if there is no such rotation."""
    observed, expected = torch.as_tensor(observed), torch.as_tensor(expected)
    if observed.shape != expected.shape or observed.numel() < 2:
        return None
    for shift in range(1, observed.numel()):
        if torch.equal(expected.roll(shift), observed):
            return shift
    return None


def match_rows(
    rows: torch.Tensor, candidates: torch.Tensor, *, atol: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of ``rows`` ``[n, d]``, the index of the nearest of ``candidates`` ``[M, d]``
    (−1 when none lies within ``atol`` in max-abs distance) and that distance ``[n]``.

    This is how a queue entry is traced back to the vector it is a copy of (I2).
    """
    rows = rows.detach().to(torch.float64)
    candidates = candidates.detach().to(torch.float64)
    if rows.numel() == 0 or candidates.numel() == 0:
        n = rows.shape[0]
        return torch.full((n,), -1, dtype=torch.int64), torch.full((n,), float("inf"))
    distance = torch.cdist(rows, candidates, p=float("inf"))  # [n, M]
    best, index = distance.min(dim=1)
    index = torch.where(best <= atol, index, torch.full_like(index, -1))
    return index, best
