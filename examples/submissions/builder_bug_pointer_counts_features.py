"""A ring-buffer MoCo module (index_copy_ at (ptr + i) mod K, any batch) whose pointer advances
by keys.shape[1], the feature dimension, instead of the number of keys written: the next batch
overwrites part of this one or leaves a gap, so the buffer is not a FIFO. Invisible whenever the
embedding dimension equals the number of keys one enqueue brings."""

import copy

import torch
import torch.nn.functional as F
from torch import nn


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        if not 0.0 <= m <= 1.0:
            raise ValueError(f"m must be in [0, 1], got {m}")
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        if mlp:
            width = self.encoder_q.fc.in_features
            self.encoder_q.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                              self.encoder_q.fc)
        self.encoder_k = copy.deepcopy(self.encoder_q)
        self.encoder_k.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))  # [dim, K]
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))
        self.register_buffer("queue_ids", torch.full((K,), -1, dtype=torch.long))

    @torch.no_grad()
    def _follow_query(self):
        for key, query in zip(self.encoder_k.parameters(), self.encoder_q.parameters()):
            key.lerp_(query, 1.0 - self.m)

    @torch.no_grad()
    def _push(self, keys, ids):
        ptr = int(self.queue_ptr)
        slots = (ptr + torch.arange(len(keys), device=keys.device)) % self.K
        self.queue.index_copy_(1, slots, keys.T.contiguous())
        self.queue_ids.index_copy_(0, slots, ids)
        self.queue_ptr[0] = (ptr + keys.shape[1]) % self.K  # advance past what was written

    def _oldest_first(self, buffer, dim):
        return torch.roll(buffer, -int(self.queue_ptr), dims=dim)

    def forward(self, im_q, im_k, ids=None):
        q = F.normalize(self.encoder_q(im_q), dim=1)  # [B, dim]
        with torch.no_grad():
            self._follow_query()
            k = F.normalize(self.encoder_k(im_k), dim=1)  # [B, dim]
        negatives = self._oldest_first(self.queue, 1)  # [dim, K], a copy
        l_pos = (q * k).sum(dim=1, keepdim=True)
        l_neg = q @ negatives
        if ids is not None:
            same = ids[:, None] == self._oldest_first(self.queue_ids, 0)[None, :]
            l_neg = l_neg.masked_fill(same, float("-inf"))
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(len(q), dtype=torch.long, device=q.device)
        if ids is None:
            ids = torch.full((len(q),), -1, dtype=torch.long, device=q.device)
        self._push(k, ids)
        return logits, labels
