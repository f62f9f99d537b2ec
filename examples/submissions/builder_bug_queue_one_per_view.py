"""A symmetric MoCo (solo-learn's MoCo V2+ layout) with one queue per view kept in a single
[2, dim, K] buffer: q1 against k2 and the old keys of view 2, q2 against k1 and those of view
1. The buffer is not the interface's [dim, K]: contract-builder-interface fails, the checks
that read the buffer say they need it, and the encoders' checks are judged as usual."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@torch.no_grad()
def gather(t):
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.cat(out, dim=0)


def moco_loss_func(query, key, queue, temperature):
    pos = torch.einsum("nc,nc->n", [query, key]).unsqueeze(-1)
    neg = torch.einsum("nc,ck->nk", [query, queue])
    logits = torch.cat([pos, neg], dim=1) / temperature
    targets = torch.zeros(query.size(0), device=query.device, dtype=torch.long)
    return F.cross_entropy(logits, targets)


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.99, T=0.2, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:
            for enc in (self.encoder_q, self.encoder_k):
                w = enc.fc.in_features
                enc.fc = nn.Sequential(nn.Linear(w, w), nn.ReLU(), enc.fc)
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            pk.data.copy_(pq.data)
            pk.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(2, dim, K), dim=1))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update(self):
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            pk.data = self.m * pk.data + (1 - self.m) * pq.data

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        batch_size = keys.shape[1]
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        keys = keys.permute(0, 2, 1)
        self.queue[:, :, ptr:ptr + batch_size] = keys
        self.queue_ptr[0] = (ptr + batch_size) % self.K

    def forward(self, im_q, im_k):
        q1 = F.normalize(self.encoder_q(im_q), dim=-1)
        q2 = F.normalize(self.encoder_q(im_k), dim=-1)
        with torch.no_grad():
            self._momentum_update()
            k1 = F.normalize(self.encoder_k(im_q), dim=-1)
            k2 = F.normalize(self.encoder_k(im_k), dim=-1)
        queue = self.queue.clone().detach()
        loss = (moco_loss_func(q1, k2, queue[1], self.T) + moco_loss_func(q2, k1, queue[0], self.T)) / 2
        keys = torch.stack((gather(k1), gather(k2)))
        self._dequeue_and_enqueue(keys)
        return loss
