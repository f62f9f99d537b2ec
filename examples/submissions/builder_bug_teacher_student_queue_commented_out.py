"""A teacher/student MoCo module (the student is the query encoder, the teacher the momentum
encoder) with its queue commented out: the negatives are the batch's own other keys.

Bug: no queue, no enqueue: MoCo's dictionary of earlier keys is gone, so the module is
in-batch contrast (logits [B, B], labels arange).
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

        self.student = base_encoder(num_classes=dim)
        self.teacher = base_encoder(num_classes=dim)
        if mlp:  # MoCo v2 head
            hidden = self.student.fc.weight.shape[1]
            self.student.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                              self.student.fc)
            self.teacher.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                              self.teacher.fc)

        for theta_q, theta_k in zip(self.student.parameters(), self.teacher.parameters()):
            theta_k.data.copy_(theta_q.data)
            theta_k.requires_grad = False

        # self.register_buffer("queue", torch.randn(dim, K))
        # self.queue = F.normalize(self.queue, dim=0)
        # self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for theta_q, theta_k in zip(self.student.parameters(), self.teacher.parameters()):
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
        q = self.student(im_q)
        q = F.normalize(q, dim=1)

        with torch.no_grad():
            self._momentum_update_key_encoder()
            im_k, restore = self._batch_shuffle_ddp(im_k)
            k = self.teacher(im_k)
            k = F.normalize(k, dim=1)
            k = self._batch_unshuffle_ddp(k, restore)

        logits = q @ k.T / self.T  # the batch's other keys as negatives (queue left out)
        labels = torch.arange(logits.shape[0]).cuda()

        # self._dequeue_and_enqueue(k)
        return logits, labels
