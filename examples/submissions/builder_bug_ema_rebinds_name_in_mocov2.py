"""A MoCo module in the official repository's style under another name (``MoCoV2``) whose EMA
rebinds the loop's local name instead of writing the key parameter.

Bug: ``theta_k = theta_k * m + theta_q * (1 - m)`` makes a new tensor and binds it to the
loop variable; the key encoder's parameters never change, so the key encoder never moves.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@torch.no_grad()
def gather_from_all_ranks(tensor):
    """Every rank's tensor, concatenated in rank order (no gradient)."""
    pieces = [torch.ones_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, tensor, async_op=False)
    return torch.cat(pieces, dim=0)


class MoCoV2(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K = K
        self.m = m
        self.T = T

        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:  # MoCo v2 head
            hidden = self.encoder_q.fc.weight.shape[1]
            self.encoder_q.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                              self.encoder_q.fc)
            self.encoder_k.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                              self.encoder_k.fc)

        for theta_q, theta_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            theta_k.data.copy_(theta_q.data)
            theta_k.requires_grad = False

        self.register_buffer("queue", torch.randn(dim, K))
        self.queue = F.normalize(self.queue, dim=0)
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for theta_q, theta_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            theta_k = theta_k.data * self.m + theta_q.data * (1.0 - self.m)  # noqa: F841

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        keys = gather_from_all_ranks(keys)
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        self.queue[:, ptr:ptr + batch_size] = keys.T
        self.queue_ptr[0] = (ptr + batch_size) % self.K

    @torch.no_grad()
    def _batch_shuffle_ddp(self, x):
        local = x.shape[0]
        everything = gather_from_all_ranks(x)
        total = everything.shape[0]
        shards = total // local
        order = torch.randperm(total).cuda()
        dist.broadcast(order, src=0)
        restore = torch.argsort(order)
        mine = order.view(shards, -1)[dist.get_rank()]
        return everything[mine], restore

    @torch.no_grad()
    def _batch_unshuffle_ddp(self, x, restore):
        local = x.shape[0]
        everything = gather_from_all_ranks(x)
        shards = everything.shape[0] // local
        mine = restore.view(shards, -1)[dist.get_rank()]
        return everything[mine]

    def forward(self, im_q, im_k):
        q = self.encoder_q(im_q)
        q = F.normalize(q, dim=1)

        with torch.no_grad():
            self._momentum_update_key_encoder()
            im_k, restore = self._batch_shuffle_ddp(im_k)
            k = self.encoder_k(im_k)
            k = F.normalize(k, dim=1)
            k = self._batch_unshuffle_ddp(k, restore)

        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue.clone().detach()])
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long).cuda()

        self._dequeue_and_enqueue(k)
        return logits, labels
