"""A symmetric MoCo (MoCo v2+ style: forward returns the two (logits, labels) pairs, each view a
query against the other view's key) trained with DDP. Shuffle-BN is done right: the key images
of all ranks are gathered, shuffled with rank 0's broadcast permutation and put back. But the
enqueue came from the single-GPU version of the code: it writes this rank's own keys of both
views (im_q's, then im_k's). On one process nothing changes; on several, each rank's queue
receives only its own batch and the queues of the ranks drift apart.

Bug: keys are not gathered across ranks before the enqueue."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def _gather(tensor):
    out = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return torch.cat(out)


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:
            width = self.encoder_q.fc.in_features
            for net in (self.encoder_q, self.encoder_k):
                net.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(inplace=True), net.fc)
        self.encoder_k.load_state_dict(self.encoder_q.state_dict())
        for p in self.encoder_k.parameters():
            p.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _ema(self):
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.data = p_k.data * self.m + p_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _enqueue(self, keys):
        # keys: [2N, dim], this rank's keys of both views
        n = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % n == 0
        self.queue[:, ptr:ptr + n] = keys.t()
        self.queue_ptr[0] = (ptr + n) % self.K

    @torch.no_grad()
    def _shuffled_keys(self, x):
        local = x.shape[0]
        everything = _gather(x)
        order = torch.randperm(everything.shape[0])
        dist.broadcast(order, src=0)
        rank = dist.get_rank()
        k = F.normalize(self.encoder_k(everything[order[rank * local:(rank + 1) * local]]), dim=1)
        undo = torch.argsort(order)
        return _gather(k)[undo[rank * local:(rank + 1) * local]]

    def _pair(self, q, k):
        logits = torch.cat([torch.einsum("nc,nc->n", q, k).unsqueeze(-1),
                            torch.einsum("nc,ck->nk", q, self.queue.clone().detach())], dim=1)
        logits = logits / self.T
        return logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)

    def forward(self, im_q, im_k):
        q1 = F.normalize(self.encoder_q(im_q), dim=1)
        q2 = F.normalize(self.encoder_q(im_k), dim=1)
        with torch.no_grad():
            self._ema()
            k1 = self._shuffled_keys(im_q)
            k2 = self._shuffled_keys(im_k)
        pairs = self._pair(q1, k2), self._pair(q2, k1)
        self._enqueue(torch.cat([k1, k2]))
        return pairs
