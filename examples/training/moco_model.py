"""A small MoCo v2 model as a researcher writes one: two encoders, a queue in a buffer, the
EMA called by the training loop after the optimizer step (see train_moco.py)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


def small_encoder(dim: int) -> nn.Module:
    """3×8×8 images → ``dim`` features: conv, BatchNorm, ReLU, pool, an MLP head."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, dim))


class MoCoModel(nn.Module):
    def __init__(self, dim: int = 16, queue_size: int = 64, momentum: float = 0.99,
                 temperature: float = 0.2) -> None:
        super().__init__()
        self.momentum, self.temperature = momentum, temperature
        self.encoder_q = small_encoder(dim)
        self.encoder_k = copy.deepcopy(self.encoder_q)
        self.encoder_k.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(dim, queue_size), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def momentum_update(self) -> None:
        for q, k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            k.mul_(self.momentum).add_(q.detach(), alpha=1 - self.momentum)

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        start = int(self.queue_ptr)
        self.queue[:, start:start + len(keys)] = keys.T
        self.queue_ptr[0] = (start + len(keys)) % self.queue.shape[1]

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor):
        q = F.normalize(self.encoder_q(im_q), dim=1)  # [B, dim]
        with torch.no_grad():
            k = F.normalize(self.encoder_k(im_k), dim=1)  # [B, dim]
        positives = torch.einsum("nc,nc->n", q, k).unsqueeze(1)  # [B, 1]
        negatives = q @ self.queue.clone().detach()  # [B, K]
        logits = torch.cat([positives, negatives], dim=1) / self.temperature  # [B, 1 + K]
        labels = torch.zeros(len(q), dtype=torch.long)
        self.enqueue(k)
        return logits, labels
