"""A MoCo module with query_encoder/key_encoder whose queue was removed: each query's
negatives are the other images' keys of its own batch, the positive in column 0.

Bug: no queue buffer and no enqueue: MoCo's dictionary of earlier keys is gone (the logits
are [B, B], positive first, in-batch negatives after it).
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


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K = K
        self.m = m
        self.T = T

        self.query_encoder = base_encoder(num_classes=dim)
        self.key_encoder = base_encoder(num_classes=dim)
        if mlp:  # MoCo v2 head
            hidden = self.query_encoder.fc.weight.shape[1]
            self.query_encoder.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                              self.query_encoder.fc)
            self.key_encoder.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                              self.key_encoder.fc)

        for theta_q, theta_k in zip(self.query_encoder.parameters(), self.key_encoder.parameters()):
            theta_k.data.copy_(theta_q.data)
            theta_k.requires_grad = False



    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for theta_q, theta_k in zip(self.query_encoder.parameters(), self.key_encoder.parameters()):
            theta_k.data.mul_(self.m).add_(theta_q.data, alpha=1.0 - self.m)

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
        q = self.query_encoder(im_q)
        q = F.normalize(q, dim=1)

        with torch.no_grad():
            self._momentum_update_key_encoder()
            im_k, restore = self._batch_shuffle_ddp(im_k)
            k = self.key_encoder(im_k)
            k = F.normalize(k, dim=1)
            k = self._batch_unshuffle_ddp(k, restore)

        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        others = ~torch.eye(len(q), dtype=torch.bool, device=q.device)
        l_neg = (q @ k.T)[others].view(len(q), -1)  # the other images' keys of this batch
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long).cuda()

        return logits, labels
