"""A single-GPU rewrite that starts its queue from torch.randn without normalizing it: the
initial negatives have norms around sqrt(dim) while every key enqueued later has norm 1, so
until the queue has wrapped once the logits of the random entries are several times too large
and dominate the softmax.

Bug: the initial random queue is not normalized (each column must be a unit vector)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.dim, self.K, self.m, self.T = dim, K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:
            for encoder in (self.encoder_q, self.encoder_k):
                width = encoder.fc.weight.shape[1]
                encoder.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(), encoder.fc)
        self.encoder_k.load_state_dict(self.encoder_q.state_dict())
        for p in self.encoder_k.parameters():
            p.requires_grad = False
        self.register_buffer("queue", torch.randn(dim, K))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _update_key_encoder(self):
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.mul_(self.m).add_(p_q, alpha=1.0 - self.m)

    @torch.no_grad()
    def _enqueue(self, keys):
        ptr = int(self.queue_ptr)
        self.queue[:, ptr:ptr + keys.shape[0]] = keys.T
        self.queue_ptr[0] = (ptr + keys.shape[0]) % self.K

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._update_key_encoder()
            k = F.normalize(self.encoder_k(im_k), dim=1)
        l_pos = torch.einsum("nc,nc->n", q, k)[:, None]
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        self._enqueue(k)
        return logits, torch.zeros(logits.shape[0], dtype=torch.long)
