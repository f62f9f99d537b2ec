"""A symmetric MoCo module (MoCo v2+ style) written for DDP that returns its two (logits,
labels) pairs second direction first: im_k's queries against im_q's keys, then im_q's against
im_k's. The order of the pairs is the module's choice; each half is judged as the pair of
views it holds."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@torch.no_grad()
def concat_all_gather(tensor):
    """Every rank's tensor, concatenated in rank order (no gradient)."""
    pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, tensor.contiguous(), async_op=False)
    return torch.cat(pieces, dim=0)


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:
            hidden = self.encoder_q.fc.weight.shape[1]
            for net in (self.encoder_q, self.encoder_k):
                net.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), net.fc)
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.data.copy_(p_q.data)
            p_k.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.data.mul_(self.m).add_(p_q.data, alpha=1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        keys = concat_all_gather(keys)  # [world · n, dim]
        n = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % n == 0
        self.queue[:, ptr:ptr + n] = keys.T
        self.queue_ptr[0] = (ptr + n) % self.K

    @torch.no_grad()
    def _batch_shuffle_ddp(self, x):
        local = x.shape[0]
        everything = concat_all_gather(x)
        order = torch.randperm(everything.shape[0]).cuda()
        dist.broadcast(order, src=0)
        restore = torch.argsort(order)
        mine = order.view(-1, local)[dist.get_rank()]
        return everything[mine], restore

    @torch.no_grad()
    def _batch_unshuffle_ddp(self, x, restore):
        local = x.shape[0]
        everything = concat_all_gather(x)
        return everything[restore.view(-1, local)[dist.get_rank()]]

    @torch.no_grad()
    def _keys(self, images):
        shuffled, restore = self._batch_shuffle_ddp(images)
        k = F.normalize(self.encoder_k(shuffled), dim=1)
        return self._batch_unshuffle_ddp(k, restore)  # [N, dim], in image order

    def _half(self, q, k):
        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue.clone().detach()])
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        return logits, torch.zeros(logits.shape[0], dtype=torch.long).cuda()

    def forward(self, im_q, im_k):
        q1 = F.normalize(self.encoder_q(im_q), dim=1)
        q2 = F.normalize(self.encoder_q(im_k), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            k1 = self._keys(im_q)
            k2 = self._keys(im_k)
        first, second = self._half(q1, k2), self._half(q2, k1)
        self._dequeue_and_enqueue(torch.cat([k1, k2], dim=0))
        return second, first
