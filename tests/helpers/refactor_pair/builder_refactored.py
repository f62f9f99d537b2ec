"""The official-style module refactored the way a maintainer might: the key encoder takes the
query encoder's state_dict, the EMA is written with lerp_, the enqueue is an index_copy_ into
a ring, the positive logit is a row-wise dot product and the negatives one matmul — the same
MoCo transition at every step, reordered arithmetic."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@torch.no_grad()
def _gathered(tensor):
    pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, tensor)
    return torch.cat(pieces)


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q, self.encoder_k = (base_encoder(num_classes=dim) for _ in range(2))
        if mlp:
            for encoder in (self.encoder_q, self.encoder_k):
                hidden = encoder.fc.in_features
                encoder.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), encoder.fc)
        self.encoder_k.load_state_dict(self.encoder_q.state_dict())
        self.encoder_k.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _ema(self):
        for k_param, q_param in zip(self.encoder_k.parameters(), self.encoder_q.parameters()):
            k_param.lerp_(q_param, 1.0 - self.m)

    @torch.no_grad()
    def _push(self, keys):
        keys = _gathered(keys)
        start = int(self.queue_ptr)
        assert self.K % len(keys) == 0  # as the official module: K a multiple of the batch
        slots = (start + torch.arange(len(keys))) % self.K
        self.queue.index_copy_(1, slots, keys.T.contiguous())
        self.queue_ptr[0] = (start + len(keys)) % self.K

    @torch.no_grad()
    def _keys(self, im_k):
        local = im_k.shape[0]
        everything = _gathered(im_k)
        order = torch.randperm(everything.shape[0])
        dist.broadcast(order, src=0)
        rank = dist.get_rank()
        mine = order.view(-1, local)[rank]
        k = F.normalize(self.encoder_k(everything[mine]), dim=1)
        back = torch.argsort(order).view(-1, local)[rank]
        return _gathered(k)[back]

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)  # [N, C]
        with torch.no_grad():
            self._ema()
            k = self._keys(im_k)  # [N, C]
        l_pos = (q * k).sum(dim=1, keepdim=True)
        l_neg = q @ self.queue.clone()
        logits = torch.cat([l_pos, l_neg], dim=1).div(self.T)
        self._push(k)
        return logits, torch.zeros(len(q), dtype=torch.long)
