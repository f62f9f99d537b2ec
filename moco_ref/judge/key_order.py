"""Which image's key each query was paired with, when the key batch was shuffled before the
key encoder (shuffle-BN, or a loop that copies it) and put back in another order than the
images' (grader's process).

The key encoder's rows name the order it ran on: row ``r`` holds the image at ``perm[r]`` of
the batch. Putting the keys back takes the inverse, ``k[argsort(perm)]``; two mistakes leave
each query beside another image's key:

- ``"unshuffle missing"``: the keys stay in the order the encoder ran on, ``k``;
- ``"shuffled twice"``: the "unshuffle" indexes with the permutation itself, ``k[perm]``.

Row ``j`` of the submission's keys is then the key of the batch's image ``order[j]``, with
``order = perm`` or ``perm[perm]``. A ``lab`` run tells which from its returned queue (each
entry is stored beside the id of the row it was enqueued at); a ``builder`` run from the
positive logits it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moco_ref.judge.assertions import fmt_ids
from moco_ref.judge.invariants import match_rows

RULES = {
    "unshuffle missing": lambda perm: perm,
    "shuffled twice": lambda perm: perm[perm],
}
CAUSES = {
    "unshuffle missing": "the keys are in the shuffled order the key encoder ran on{rows}: "
                         "the unshuffle is missing",
    "shuffled twice": "the keys are the shuffled order applied twice: the unshuffle indexes "
                      "with the permutation itself where its inverse (argsort) belongs",
}


@dataclass(frozen=True)
class PositiveOrder:
    """How a run's keys came back: ``rule`` (of ``RULES``) and, per step, ``orders[t]``
    ``[B_t]``: row j of the submission's keys is the key of the batch's image ``orders[t][j]``
    (the identity at a step whose key batch was not shuffled)."""

    rule: str
    orders: list[torch.Tensor]


def shuffle_of(ids: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor | None:
    """``perm`` ``[B]`` with ``seen[r] == ids[perm[r]]``: the order the key encoder ran on
    (``seen``, its rows' ids) as positions in the batch (``ids``); None when ``seen`` is no
    reordering of ``ids`` (or leaves them as they are)."""
    if seen is None or len(seen) != len(ids) or torch.equal(seen, ids):
        return None
    where = {int(source): row for row, source in enumerate(ids.tolist())}
    if len(where) != len(ids) or sorted(where) != sorted(set(seen.tolist())) \
            or len(set(seen.tolist())) != len(seen):
        return None
    return torch.tensor([where[int(source)] for source in seen.tolist()], dtype=torch.int64)


def rule_of(images: list[int], rows: list[int]) -> str | None:
    """The rule of ``RULES`` by which keys whose row j holds the key of image ``images[j]``
    came back from a key encoder that ran on the images ``rows`` (row r: image ``rows[r]``);
    None when neither explains them."""
    if sorted(rows) != list(range(len(rows))) or rows == list(range(len(rows))):
        return None
    perm = torch.tensor(rows, dtype=torch.int64)
    for rule, order in RULES.items():
        if order(perm).tolist() == images:
            return rule
    return None


def cause(rule: str | None, rows: list[int] | None = None) -> str:
    """Why the keys are out of order, in the report's words (empty for no known rule)."""
    if rule is None:
        return ""
    return "; " + CAUSES[rule].format(rows=f" (rows {fmt_ids(rows)})" if rows else "")


def find_positive_order(ids: list[torch.Tensor], keys: list[torch.Tensor],
                        seen: list[torch.Tensor | None], queue: torch.Tensor,
                        queue_ids: torch.Tensor, *, atol: float) -> PositiveOrder | None:
    """The rule by which a ``lab`` run's keys came back, read from its returned queue: per
    step the batch's ``ids`` ``[B]``, its keys in image order ``keys`` ``[B, d]`` and the ids
    the key encoder ``seen`` in its row order; ``queue`` ``[n, d]`` and ``queue_ids`` ``[n]``
    as returned. Found when, with the keys in image order, some entry sits beside another
    image's id, and under the rule every entry the keys explain sits beside its own row's id;
    None otherwise (no shuffle, no entry, or an order no rule explains)."""
    perms = [shuffle_of(batch, rows) for batch, rows in zip(ids, seen)]
    if all(perm is None for perm in perms) or queue.ndim != 2 or len(queue) == 0 \
            or queue_ids.shape != (len(queue),):
        return None
    entries = F.normalize(queue.detach().to(torch.float64), dim=1)
    flat_ids = torch.cat(ids).to(torch.int64)

    def agreement(orders: list[torch.Tensor]) -> tuple[int, int]:
        table = torch.cat([F.normalize(k.to(torch.float64)[order], dim=1)
                           for k, order in zip(keys, orders)])
        index, _ = match_rows(entries, table, atol=atol)
        found = index >= 0
        same = flat_ids[index[found]] == queue_ids[found].to(torch.int64)
        return int(found.sum()), int(same.sum())

    identity = [torch.arange(len(batch)) for batch in ids]
    matched, agreeing = agreement(identity)
    if matched == 0 or agreeing == matched:
        return None
    for rule, order in RULES.items():
        orders = [order(perm) if perm is not None else plain
                  for perm, plain in zip(perms, identity)]
        found, same = agreement(orders)
        if found == matched and same == found:
            return PositiveOrder(rule, orders)
    return None
