"""A single-GPU symmetric MoCo that encodes both views in ONE forward of each encoder:
encoder_q(torch.cat([im1, im2])) gives the 2N queries, the key encoder runs on the views
swapped (torch.cat([im2, im1]), shuffled on this device and put back), so row i of the keys is
the other view of query i's image; one [2N, 1 + K] logits tensor with 2N zero labels. The
keys of both views are enqueued afterwards, those of im1 first.

Correct: the grader pairs queries with keys by the rows each forward computed, not by one
forward per view."""

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
        n = im1.shape[0]
        q = F.normalize(self.encoder_q(torch.cat([im1, im2])), dim=1)  # [2N, dim]
        k = self._keys(torch.cat([im2, im1]))  # [2N, dim]: row i the other view of q's row i
        l_pos = (q * k).sum(dim=1, keepdim=True)
        l_neg = q @ self.queue.clone().detach()
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T  # [2N, 1 + K]
        labels = torch.zeros(2 * n, dtype=torch.long, device=logits.device)
        self._dequeue_and_enqueue(torch.cat([k[n:], k[:n]]))
        return logits, labels
