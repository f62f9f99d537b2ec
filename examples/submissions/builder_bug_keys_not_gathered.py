"""A fork of the official-style module made for "one machine, several GPUs": shuffle-BN is kept
(it still gathers the images of every rank, shuffles them with rank 0's permutation and undoes
it), but the enqueue was simplified to write this rank's own keys. On one process nothing
changes; on several, each rank's queue receives only its own batch, so the queues of the ranks
drift apart and most keys of the world batch never become negatives.

Bug: keys are not gathered across ranks before the enqueue."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def _world():
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@torch.no_grad()
def _all_ranks(tensor):
    if _world() == 1:
        return tensor
    out = [torch.empty_like(tensor) for _ in range(_world())]
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
            p.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.mul_(self.m).add_(p_q.detach(), alpha=1 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        # keys: [N, dim] — only this rank's batch
        n = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % n == 0
        self.queue[:, ptr:ptr + n] = keys.t()
        self.queue_ptr[0] = (ptr + n) % self.K

    @torch.no_grad()
    def _shuffled(self, x):
        local = x.shape[0]
        everything = _all_ranks(x)
        order = torch.randperm(everything.shape[0])
        if _world() > 1:
            dist.broadcast(order, src=0)
        rank = dist.get_rank() if _world() > 1 else 0
        return everything[order[rank * local:(rank + 1) * local]], torch.argsort(order)

    @torch.no_grad()
    def _unshuffled(self, x, undo):
        local = x.shape[0]
        rank = dist.get_rank() if _world() > 1 else 0
        return _all_ranks(x)[undo[rank * local:(rank + 1) * local]]

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)  # [N, dim]
        with torch.no_grad():
            self._momentum_update_key_encoder()
            shuffled, undo = self._shuffled(im_k)
            k = F.normalize(self.encoder_k(shuffled), dim=1)
            k = self._unshuffled(k, undo)  # [N, dim]
        l_pos = (q * k).sum(dim=1, keepdim=True)  # [N, 1]
        l_neg = q @ self.queue.clone().detach()  # [N, K]
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        self._dequeue_and_enqueue(k)
        return logits, labels
