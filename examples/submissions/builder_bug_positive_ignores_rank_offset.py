"""A MoCo module in the official repository's shape (shuffle-BN through all_gather and
broadcast, a [dim, K] buffer) that picks each query's positive out of the similarities to the
keys gathered from every rank by the query's row alone, without the rank's offset: on one
process that is its own key, on two, rank 1's queries get rank 0's keys as positives. The
queue itself is right, so only the across-ranks pairing is charged."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def _gather(tensor):
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    out = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor, async_op=False)
    return torch.cat(out, dim=0)


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:
            width = self.encoder_q.fc.weight.shape[1]
            self.encoder_q.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(), self.encoder_q.fc)
            self.encoder_k.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(), self.encoder_k.fc)
        for source, target in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            target.data.copy_(source.data)
            target.requires_grad = False
        self.register_buffer("queue", nn.functional.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for source, target in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            target.data = target.data * self.m + source.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        keys = _gather(keys)
        batch = keys.shape[0]
        start = int(self.queue_ptr)
        assert self.K % batch == 0
        self.queue[:, start : start + batch] = keys.T
        self.queue_ptr[0] = (start + batch) % self.K

    @torch.no_grad()
    def _batch_shuffle(self, x):
        if not (dist.is_available() and dist.is_initialized()):
            return x, torch.arange(x.shape[0])
        everything = _gather(x)
        order = torch.randperm(everything.shape[0])
        dist.broadcast(order, src=0)
        back = torch.argsort(order)
        mine = order.view(dist.get_world_size(), -1)[dist.get_rank()]
        return everything[mine], back

    @torch.no_grad()
    def _batch_unshuffle(self, x, back):
        if not (dist.is_available() and dist.is_initialized()):
            return x[back]
        everything = _gather(x)
        return everything[back.view(dist.get_world_size(), -1)[dist.get_rank()]]

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            shuffled, back = self._batch_shuffle(im_k)
            k = F.normalize(self.encoder_k(shuffled), dim=1)
            k = self._batch_unshuffle(k, back)
            k_all = _gather(k)
        l_pos_all = torch.einsum("nc,kc->nk", q, k_all)  # [N, world · N] against every key
        rows = torch.arange(q.shape[0])
        l_pos = l_pos_all[rows, rows].unsqueeze(-1)  # global row i: rank 0's image i, any rank
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels
