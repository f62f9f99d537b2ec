"""``MoCo``: a drop-in for the official repository's module, built on the reference core.

Same constructor, buffers (``queue`` ``[dim, K]``, ``queue_ptr``) and ``forward(im_q, im_k)
-> (logits, labels)``; an official checkpoint loads strictly (its queue gets no source ids)
and ``official_state_dict()`` is one the official module loads strictly. Beyond the official
one: ``forward(..., ids=...)`` masks same-source negatives, K need not be a multiple of the
batch size, ``order`` chooses where the EMA sits, and bad arguments raise clear errors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from moco_ref.core.contrastive import contrastive_logits, positive_labels
from moco_ref.core.distributed import concat_all_gather, shuffle_batch, unshuffle_batch
from moco_ref.core.momentum import momentum_update
from moco_ref.core.queue import KeyQueue
from moco_ref.core.step import ORDERS
from moco_ref.core.validation import (
    require_count,
    require_matrix,
    require_positive,
    require_probability,
)

NO_SOURCE = -1  # id of the random keys the queue starts with: never masked


class MoCo(nn.Module):
    """Query encoder, momentum key encoder and a queue of ``K`` keys of dimension ``dim``.

    ``order="lab"`` (official): the EMA runs inside ``forward`` before the key forward.
    ``order="paper"``: ``forward`` leaves θk alone; call ``update_key_encoder()`` after the
    optimizer step.
    """

    def __init__(
        self,
        base_encoder: Callable[..., nn.Module],
        dim: int = 128,
        K: int = 65536,
        m: float = 0.999,
        T: float = 0.07,
        mlp: bool = False,
        *,
        order: str = "lab",
        shuffle_bn: bool = True,
    ) -> None:
        super().__init__()
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.dim = require_count("dim", dim)
        self.K = require_count("K", K)
        self.m = require_probability("m", m)
        self.T = require_positive("T", T)
        self.order, self.shuffle_bn = order, shuffle_bn

        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:
            for encoder in (self.encoder_q, self.encoder_k):
                if not isinstance(getattr(encoder, "fc", None), nn.Linear):
                    raise TypeError("mlp=True needs an encoder whose last layer is a Linear `.fc`")
                hidden = encoder.fc.weight.shape[1]
                encoder.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), encoder.fc)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False

        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))  # [dim, K]
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))
        self.register_buffer("queue_ids", torch.full((K,), NO_SOURCE, dtype=torch.long))  # [K]

    def _load_from_state_dict(self, state_dict, prefix, *args) -> None:
        # An official checkpoint has no queue_ids: its queued keys come from images nobody
        # recorded, so they are never masked. load_state_dict passes a copy of the dict, and
        # every argument positionally.
        if prefix + "queue" in state_dict and prefix + "queue_ids" not in state_dict:
            state_dict[prefix + "queue_ids"] = torch.full_like(self.queue_ids, NO_SOURCE)
        if prefix + "queue" in state_dict:  # every entry is checked on arrival (forward)
            require_matrix("the checkpoint's queue", state_dict[prefix + "queue"])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def official_state_dict(self) -> dict[str, torch.Tensor]:
        """``state_dict()`` without ``queue_ids``: what the official module loads strictly."""
        return {name: value for name, value in self.state_dict().items() if name != "queue_ids"}

    def _dictionary(self) -> KeyQueue:
        """The reference FIFO over this module's buffers (no copy)."""
        return KeyQueue.over_storage(self.queue.T, self.queue_ids, int(self.queue_ptr), self.K)

    # `with torch.no_grad()` rather than the decorator, so that mutation testing reaches
    # these bodies (mutmut leaves decorated functions alone).
    def _momentum_update_key_encoder(self) -> None:
        momentum_update(self.encoder_k, self.encoder_q, self.m)  # no autograd inside

    def _encode_keys(self, im_k: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if self.shuffle_bn:
                im_k, undo = shuffle_batch(im_k)
            k = F.normalize(self.encoder_k(im_k), dim=1)  # [B, dim]
            return unshuffle_batch(k, undo) if self.shuffle_bn else k

    def _dequeue_and_enqueue(self, keys: torch.Tensor, ids: torch.Tensor) -> None:
        with torch.no_grad():
            keys, ids = concat_all_gather(keys), concat_all_gather(ids)  # rank order
            dictionary = self._dictionary()
            dictionary.enqueue(keys, ids)
            self.queue_ptr[0] = dictionary.ptr

    def update_key_encoder(self) -> None:
        """The paper order's EMA: call after ``optimizer.step()``."""
        if self.order != "paper":
            raise RuntimeError("order='lab' updates the key encoder inside forward")
        self._momentum_update_key_encoder()

    def forward(
        self, im_q: torch.Tensor, im_k: torch.Tensor, ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B, 1 + K]`` (positive at column 0, negatives in queue storage order) and
        labels ``zeros(B)``. With ``ids`` ``[B]``, negatives from the query's own source
        image are masked to −inf."""
        if im_q.shape[0] != im_k.shape[0]:
            raise ValueError(f"im_q and im_k must hold the same batch, got {im_q.shape[0]} "
                             f"and {im_k.shape[0]} images")
        q = F.normalize(self.encoder_q(im_q), dim=1)  # [B, dim]
        if self.order == "lab":
            self._momentum_update_key_encoder()
        k = self._encode_keys(im_k)  # [B, dim]
        negatives = self.queue.clone().T  # [K, dim]; the enqueue below must not touch it
        if ids is None:
            logits = contrastive_logits(q, k, negatives, None, None, self.T, queue_checked=True)
            ids = torch.full((len(q),), NO_SOURCE, dtype=torch.long, device=q.device)
        else:
            ids = ids.to(q.device)
            logits = contrastive_logits(q, k, negatives, self.queue_ids.clone(), ids, self.T,
                                        queue_checked=True)
        labels = positive_labels(len(q), q.device)
        self._dequeue_and_enqueue(k, ids)
        return logits, labels
