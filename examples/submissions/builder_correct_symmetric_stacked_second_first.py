"""A single-GPU symmetric module that stacks both directions into one [2N, 1 + K] logits with
2N zero labels, the im2 → im1 rows first: one cross-entropy over both halves, each read as the
pair of views it holds."""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=4096, m=0.99, T=0.1, mlp=False, symmetric=True):
        super().__init__()
        self.K, self.m, self.T, self.symmetric = K, m, T, symmetric
        self.encoder_q = base_encoder(num_classes=dim)
        if mlp:
            width = self.encoder_q.fc.in_features
            self.encoder_q.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                              self.encoder_q.fc)
        self.encoder_k = copy.deepcopy(self.encoder_q)
        for p in self.encoder_k.parameters():
            p.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.data = p_k.data * self.m + p_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        # keys: [n, dim]
        n = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % n == 0
        self.queue[:, ptr:ptr + n] = keys.t()
        self.queue_ptr[0] = (ptr + n) % self.K

    @torch.no_grad()
    def _keys(self, images):
        order = torch.randperm(images.shape[0])
        k = F.normalize(self.encoder_k(images[order]), dim=1)
        return k[torch.argsort(order)]  # [N, dim], back in image order

    def half(self, im_a, im_b):
        """The logits [N, 1 + K] of im_a's queries against im_b's keys, and those keys."""
        q = F.normalize(self.encoder_q(im_a), dim=1)  # [N, dim]
        k = self._keys(im_b)  # [N, dim]
        l_pos = (q * k).sum(dim=1, keepdim=True)
        l_neg = q @ self.queue.clone().detach()
        return torch.cat([l_pos, l_neg], dim=1) / self.T, k

    def forward(self, im1, im2):
        with torch.no_grad():
            self._momentum_update_key_encoder()
        if self.symmetric:
            logits_12, k2 = self.half(im1, im2)
            logits_21, k1 = self.half(im2, im1)
            logits = torch.cat([logits_21, logits_12], dim=0)  # [2N, 1 + K]
            k = torch.cat([k1, k2], dim=0)
        else:
            logits, k = self.half(im1, im2)
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        self._dequeue_and_enqueue(k)
        return logits, labels
