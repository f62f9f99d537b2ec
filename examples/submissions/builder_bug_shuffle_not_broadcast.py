"""A MoCo v2 module written from the paper's description of shuffle-BN rather than from the
official code: the key images of all ranks are collected, permuted, split among the ranks and,
after the key encoder, collected again and put back with the inverse permutation. Each rank
draws the permutation itself, so the ranks do not agree on it: images are encoded twice or not
at all, and queries are handed the keys of other images. With one process (or one shared seed)
it is correct.

Bug: the shuffle's permutation is not broadcast from rank 0."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class ShuffleBN:
    """Hides the batch statistics of the key encoder by mixing images across ranks."""

    def __init__(self):
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()

    @torch.no_grad()
    def collect(self, x):
        pieces = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(pieces, x.contiguous())
        return torch.cat(pieces)

    @torch.no_grad()
    def mix(self, x):
        everything = self.collect(x)
        self.permutation = torch.randperm(everything.shape[0])
        return everything[self.permutation.chunk(self.world)[self.rank]]

    @torch.no_grad()
    def unmix(self, y):
        everything = self.collect(y)
        inverse = torch.empty_like(self.permutation)
        inverse[self.permutation] = torch.arange(len(self.permutation))
        return everything[inverse.chunk(self.world)[self.rank]]


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        if mlp:
            hidden = self.encoder_q.fc.weight.shape[1]
            self.encoder_q.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                              self.encoder_q.fc)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:
            hidden = self.encoder_k.fc.weight.shape[1]
            self.encoder_k.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                              self.encoder_k.fc)
        for q_param, k_param in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            k_param.data.copy_(q_param.data)
            k_param.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, im_q, im_k):
        shuffle = ShuffleBN()
        q = F.normalize(self.encoder_q(im_q), dim=1)  # [N, C]
        with torch.no_grad():
            for q_param, k_param in zip(self.encoder_q.parameters(),
                                        self.encoder_k.parameters()):
                k_param.data = k_param.data * self.m + q_param.data * (1.0 - self.m)
            k = shuffle.unmix(F.normalize(self.encoder_k(shuffle.mix(im_k)), dim=1))  # [N, C]
        logits = torch.cat([torch.einsum("nc,nc->n", q, k)[:, None],
                            torch.einsum("nc,ck->nk", q, self.queue.clone().detach())], dim=1)
        logits = logits / self.T
        labels = torch.zeros(len(logits), dtype=torch.long)
        with torch.no_grad():
            keys = shuffle.collect(k)  # [world · N, C], rank order
            ptr = int(self.queue_ptr)
            self.queue[:, ptr:ptr + len(keys)] = keys.T
            self.queue_ptr[0] = (ptr + len(keys)) % self.K
        return logits, labels
