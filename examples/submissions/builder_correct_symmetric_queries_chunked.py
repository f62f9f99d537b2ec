"""A single-GPU symmetric MoCo whose queries come from one forward of encoder_q over both
views, split with .chunk(2), and whose keys come from two forwards of the key encoder, one
per view; the two directions are returned as one stacked [2N, 1 + K] logits tensor.

Correct: a forward that covers both views gives each view its own queries."""

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

    def forward(self, im1, im2):
        with torch.no_grad():
            self._momentum_update_key_encoder()
        q1, q2 = F.normalize(self.encoder_q(torch.cat([im1, im2])), dim=1).chunk(2)  # [N, dim]
        k1, k2 = self._keys(im1), self._keys(im2)  # [N, dim] each
        queue = self.queue.clone().detach()
        halves = [torch.cat([(q * k).sum(dim=1, keepdim=True), q @ queue], dim=1)
                  for q, k in ((q1, k2), (q2, k1))]
        logits = torch.cat(halves) / self.T  # [2N, 1 + K]
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        self._dequeue_and_enqueue(torch.cat([k1, k2]))
        return logits, labels
