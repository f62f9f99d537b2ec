"""A symmetric MoCo (MoCo v2+ style: each view a query against the other view's key, the two
cross-entropies added and returned as the loss) ported to several GPUs. Shuffle-BN collects the
key images of all ranks, permutes them and gives each rank its slice; the port relied on every
process having been started with the same seed, so each rank draws the permutation itself and
nothing broadcasts rank 0's. Each view's keys are gathered and enqueued by their own call, im_q's
first. With one process (or one shared seed) it is correct.

Bug: the shuffle's permutation is not broadcast from rank 0, so on several processes images are
encoded twice or not at all and queries are handed the keys of other images."""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def all_ranks(x):
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, x.contiguous())
    return torch.cat(pieces)


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.99, T=0.2, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        if mlp:
            width = self.encoder_q.fc.in_features
            self.encoder_q.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                              self.encoder_q.fc)
        self.encoder_k = copy.deepcopy(self.encoder_q)
        self.encoder_k.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def update_key_encoder(self):
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.lerp_(p_q.detach(), 1.0 - self.m)

    @torch.no_grad()
    def enqueue(self, keys):
        keys = all_ranks(keys)
        ptr = int(self.queue_ptr)
        self.queue[:, ptr:ptr + len(keys)] = keys.T
        self.queue_ptr[0] = (ptr + len(keys)) % self.K

    @torch.no_grad()
    def keys_of(self, images):
        rank, world = dist.get_rank(), dist.get_world_size()
        everything = all_ranks(images)
        permutation = torch.randperm(len(everything))  # the same on every rank, or so it seemed
        mine = permutation.chunk(world)[rank]
        k = F.normalize(self.encoder_k(everything[mine]), dim=1)
        inverse = torch.argsort(permutation)
        return all_ranks(k)[inverse.chunk(world)[rank]]

    def half_loss(self, q, k):
        logits = torch.cat([(q * k).sum(dim=1, keepdim=True), q @ self.queue.clone().detach()],
                           dim=1) / self.T
        return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long))

    def forward(self, x1, x2):
        q1 = F.normalize(self.encoder_q(x1), dim=1)
        q2 = F.normalize(self.encoder_q(x2), dim=1)
        with torch.no_grad():
            self.update_key_encoder()
            k1, k2 = self.keys_of(x1), self.keys_of(x2)
        loss = self.half_loss(q1, k2) + self.half_loss(q2, k1)
        self.enqueue(k1)
        self.enqueue(k2)
        return loss
