"""One MoCo training step, in either of the two valid orders (invariant I6).

``order="paper"`` (Algorithm 1 of the paper):
    q, k forward → loss → query update → EMA → enqueue
``order="lab"`` (LAB 07 and the official code):
    q forward → EMA → k forward → loss → query update → enqueue

Starting from θk = θq, both orders give the same keys, losses, queue and query parameters
at every step; after the last step the paper order has applied one more EMA.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from moco_ref.core.contrastive import (
    contrastive_logits,
    in_batch_logits,
    info_nce_loss,
    positive_labels,
)
from moco_ref.core.momentum import matched_parameters, momentum_update
from moco_ref.core.orders import ORDERS
from moco_ref.core.queue import KeyQueue
from moco_ref.core.validation import (
    require_count,
    require_ids,
    require_positive,
    require_probability,
)


def projection_of(output: object) -> torch.Tensor:
    """The embedding in a model's output: the tensor itself, or the last element of a tuple
    (LAB 07 models return ``(features, projection)``)."""
    if isinstance(output, (tuple, list)) and output:
        output = output[-1]
    if not isinstance(output, torch.Tensor) or output.ndim != 2:
        raise TypeError(
            "the encoder must return a [B, d] tensor or a tuple ending with one, "
            f"got {type(output).__name__}"
        )
    return output


@dataclass(frozen=True)
class StepResult:
    """What one step computed; every tensor is detached."""

    loss: torch.Tensor  # [] mean −ln p⁺
    logits: torch.Tensor  # [B, 1 + n], or [B, B] for an in-batch (empty-queue) step
    labels: torch.Tensor  # [B]
    q: torch.Tensor  # [B, d] normalized queries
    k: torch.Tensor  # [B, d] normalized keys, the positives
    ids: torch.Tensor  # [B] source ids
    in_batch: bool  # True when the queue was empty and the batch's own keys were negatives


class MoCoTrainer:
    """Query encoder trained by ``optimizer``, key encoder following by EMA, FIFO of old keys.

    ``step(view_q, view_k, ids)`` runs one training step on a batch of two views of the
    images with source ids ``ids``. The key encoder starts as a copy of the query encoder
    unless one is given; its parameters never receive gradients.
    """

    def __init__(
        self,
        query_encoder: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        m: float,
        temperature: float,
        capacity: int,
        order: str = "lab",
        key_encoder: nn.Module | None = None,
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {optimizer!r}")
        self.m = require_probability("m", m)
        self.temperature = require_positive("temperature", temperature)
        self.capacity = require_count("capacity", capacity)
        self.order = order
        self.encoder_q = query_encoder
        self.encoder_k = copy.deepcopy(query_encoder) if key_encoder is None else key_encoder
        key_params, _ = matched_parameters(self.encoder_k, self.encoder_q)
        for param in key_params:
            param.requires_grad_(False)  # the key encoder is not gradient-trained
        self.optimizer = optimizer
        self.queue: KeyQueue | None = None  # created at the first step, when d is known

    def step(self, view_q: torch.Tensor, view_k: torch.Tensor, ids: torch.Tensor) -> StepResult:
        ids = require_ids("ids", ids, length=len(view_q))
        if len(view_k) != len(view_q):
            raise ValueError(f"view_q and view_k must hold the same batch, got {len(view_q)} "
                             f"and {len(view_k)} items")
        q = self._encode_queries(view_q)  # [B, d]
        if self.order == "lab":
            self._momentum_update_key_encoder()
        k = self._encode_keys(view_k)  # [B, d]
        logits, labels, in_batch = self._logits_and_labels(q, k, ids)
        loss = info_nce_loss(logits, labels)
        self._update_query_encoder(loss)
        if self.order == "paper":
            self._momentum_update_key_encoder()
        self._dequeue_and_enqueue(k, ids)
        return StepResult(loss.detach(), logits.detach(), labels, q.detach(), k, ids, in_batch)

    def _encode_queries(self, view_q: torch.Tensor) -> torch.Tensor:
        return F.normalize(projection_of(self.encoder_q(view_q)), dim=1)

    def _encode_keys(self, view_k: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return F.normalize(projection_of(self.encoder_k(view_k)), dim=1)

    def _momentum_update_key_encoder(self) -> None:
        momentum_update(self.encoder_k, self.encoder_q, self.m)

    def _logits_and_labels(
        self, q: torch.Tensor, k: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        if self.queue is None or len(self.queue) == 0:
            logits, labels = in_batch_logits(q, k, self.temperature, ids)
            return logits, labels, True
        logits = contrastive_logits(
            q, k, self.queue.keys, self.queue.ids, ids, self.temperature
        )  # [B, 1 + n]
        labels = positive_labels(len(q), q.device)
        return logits, labels, False

    def _update_query_encoder(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def _dequeue_and_enqueue(self, k: torch.Tensor, ids: torch.Tensor) -> None:
        if self.queue is None:
            self.queue = KeyQueue(self.capacity, k.shape[1], dtype=k.dtype, device=k.device)
        self.queue.enqueue(k, ids)
