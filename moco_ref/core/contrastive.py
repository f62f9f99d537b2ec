"""Logits and InfoNCE loss of MoCo (invariants I4, I8, I9).

The same-source mask lives here and nowhere else: a queue entry whose source id equals the
query's id is set to −inf, so its softmax probability is exactly 0. The positive (column 0)
is never masked, and the current batch's keys are never among the queue's negatives
because the caller enqueues them only after the loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from moco_ref.core.validation import (
    require_ids,
    require_matrix,
    require_positive,
    require_same_rows,
    require_tensor,
)


def same_source_pairs(
    ids: torch.Tensor, queue_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cols)``: query ``rows[i]`` and queue entry ``cols[i]`` came from the same image.

    The queue ids are sorted once and each query's id is looked up by binary search, so the
    cost is O(n log n + B log n + collisions) rather than a ``[B, n]`` comparison.
    """
    order = torch.argsort(queue_ids)  # [n]
    ordered = queue_ids[order]
    first = torch.searchsorted(ordered, ids)  # [B]
    count = torch.searchsorted(ordered, ids, right=True) - first  # [B] collisions per query
    rows = torch.repeat_interleave(count)  # [p] the query of each pair, ascending
    run_start = torch.repeat_interleave(first - (torch.cumsum(count, 0) - count), count)
    return rows, order[run_start + torch.arange(len(rows), device=ids.device)]


def same_source_mask(ids: torch.Tensor, queue_ids: torch.Tensor) -> torch.Tensor:
    """``[B, n]`` boolean: True where queue entry j came from the same image as query i."""
    mask = torch.zeros(len(ids), len(queue_ids), dtype=torch.bool, device=ids.device)
    mask[same_source_pairs(ids, queue_ids)] = True
    return mask


def contrastive_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    queue_keys: torch.Tensor,
    queue_ids: torch.Tensor | None,
    ids: torch.Tensor | None,
    temperature: float,
    *,
    queue_checked: bool = False,
) -> torch.Tensor:
    """Logits ``[B, 1 + n]``: column 0 is ``q·k⁺ / T``, column 1 + j is ``q·queue[j] / T``.

    ``q`` ``[B, d]``, ``k`` ``[B, d]`` (the positives), ``queue_keys`` ``[n, d]`` oldest first,
    ``queue_ids`` ``[n]`` and ``ids`` ``[B]`` the source ids. Negatives with the query's own
    source id are −inf. Pass ``queue_ids=None, ids=None`` to disable masking.
    ``queue_checked``: every queue entry was checked finite when it arrived (a module's own
    buffer), so the O(n·d) scan is skipped.
    """
    temperature = require_positive("temperature", temperature)
    q = require_matrix("q", q)
    k = require_matrix("k", k, dim=q.shape[1])
    require_same_rows(("q", "k"), q, k)
    queue_keys = require_matrix("queue_keys", queue_keys, dim=q.shape[1],
                                finite=not queue_checked)
    if (ids is None) != (queue_ids is None):
        raise ValueError("ids and queue_ids must both be given (masking) or both be None")
    positive = (q * k).sum(dim=1, keepdim=True)  # [B, 1], never masked
    negative = q @ queue_keys.T  # [B, n]
    if ids is not None:
        ids = require_ids("ids", ids, length=q.shape[0]).to(q.device)
        queue_ids = require_ids("queue_ids", queue_ids, length=queue_keys.shape[0]).to(q.device)
        # in place: the matmul's backward does not need its output
        negative.index_put_(same_source_pairs(ids, queue_ids), negative.new_tensor(-math.inf))
    return torch.cat([positive, negative], dim=1) / temperature  # [B, 1 + n]


def in_batch_logits(
    q: torch.Tensor, k: torch.Tensor, temperature: float, ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """LAB 07's warm-up form for an empty queue: ``q·kᵀ / T`` ``[B, B]`` with labels ``arange(B)``.

    Query i's positive is k_i; the other keys of the batch are its negatives. When ``ids``
    are given, an off-diagonal key with the query's own source id is masked like a queue
    entry would be.
    """
    temperature = require_positive("temperature", temperature)
    q = require_matrix("q", q)
    k = require_matrix("k", k, dim=q.shape[1])
    require_same_rows(("q", "k"), q, k)
    logits = q @ k.T / temperature  # [B, B]
    labels = torch.arange(q.shape[0], device=q.device)  # [B]
    if ids is not None:
        ids = require_ids("ids", ids, length=q.shape[0]).to(q.device)
        off_diagonal = ~torch.eye(q.shape[0], dtype=torch.bool, device=q.device)
        logits = logits.masked_fill(same_source_mask(ids, ids) & off_diagonal, -math.inf)
    return logits, labels


def positive_labels(batch: int, device: torch.device | None = None) -> torch.Tensor:
    """The positive sits at column 0 of every row: ``zeros(B)`` int64."""
    return torch.zeros(batch, dtype=torch.int64, device=device)


def info_nce_loss(logits: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of ``−ln p⁺`` over the batch, p = softmax(logits); the positive is column 0
    unless ``labels`` say otherwise."""
    logits = require_tensor("logits", logits)
    if not logits.is_floating_point() or logits.ndim != 2:
        raise ValueError(
            f"logits must be a floating-point [B, C] tensor, got {logits.dtype} "
            f"{list(logits.shape)}"
        )
    if bool((torch.isnan(logits) | (logits == float("inf"))).any()):
        raise ValueError("logits must not contain NaN or +inf (−inf marks a masked entry)")
    if labels is None:
        labels = positive_labels(logits.shape[0], logits.device)
    labels = require_ids("labels", labels, length=logits.shape[0]).to(logits.device)
    return F.cross_entropy(logits, labels)
