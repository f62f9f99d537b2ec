"""A single-GPU symmetric MoCo (MoCo v2+ style: each view a query against the other view's key,
forward returns the summed loss) moved to DDP by wrapping it and adding an all_gather around
the key encoder "for shuffle-BN": every rank collects the key images of all ranks, draws its
own permutation, encodes its slice and undoes the permutation it drew. The enqueue was left as
it was on one GPU. On one process it is correct; on several, neither step survives.

Bugs: the shuffle's permutation is not broadcast from rank 0 (queries are handed the keys of
other images), and the keys are not gathered across ranks before the enqueue (each rank's
queue receives only what its own queries used)."""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=4096, m=0.99, T=0.1, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
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
        n = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % n == 0
        self.queue[:, ptr:ptr + n] = keys.t()
        self.queue_ptr[0] = (ptr + n) % self.K

    @torch.no_grad()
    def _gather(self, x):
        if not dist.is_initialized():
            return x
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, x.contiguous())
        return torch.cat(pieces)

    @torch.no_grad()
    def _keys(self, images):
        n = images.shape[0]
        rank = dist.get_rank() if dist.is_initialized() else 0
        everything = self._gather(images)
        order = torch.randperm(everything.shape[0])
        k = F.normalize(self.encoder_k(everything[order[rank * n:(rank + 1) * n]]), dim=1)
        return self._gather(k)[torch.argsort(order)[rank * n:(rank + 1) * n]]

    def contrastive_loss(self, im_a, im_b):
        q = F.normalize(self.encoder_q(im_a), dim=1)
        k = self._keys(im_b)
        l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        return nn.CrossEntropyLoss()(logits, labels), k

    def forward(self, im1, im2):
        with torch.no_grad():
            self._momentum_update_key_encoder()
        loss_12, k2 = self.contrastive_loss(im1, im2)
        loss_21, k1 = self.contrastive_loss(im2, im1)
        self._dequeue_and_enqueue(torch.cat([k1, k2], dim=0))
        return loss_12 + loss_21
