"""A MoCo module whose dictionary is a collections.deque of key rows (maxlen=K), oldest first,
not the registered [dim, K] buffer and queue_ptr of the interface: the negatives are right,
but the queue is invisible to state_dict and .to(), and the grader has no buffer to follow.
contract-builder-interface fails; the checks that read the buffer say they need it; the
encoders' checks (I1, I6, I7) are judged as usual."""

import collections
import torch
import torch.nn as nn
import torch.nn.functional as F


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=4096, m=0.99, T=0.1, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:
            for enc in (self.encoder_q, self.encoder_k):
                w = enc.fc.in_features
                enc.fc = nn.Sequential(nn.Linear(w, w), nn.ReLU(), enc.fc)
        self.encoder_k.load_state_dict(self.encoder_q.state_dict())
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)
        init = F.normalize(torch.randn(K, dim), dim=1)
        self.queue = collections.deque((row for row in init), maxlen=K)

    @torch.no_grad()
    def momentum_update(self):
        for pk, pq in zip(self.encoder_k.parameters(), self.encoder_q.parameters()):
            pk.mul_(self.m).add_(pq.detach(), alpha=1.0 - self.m)

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self.momentum_update()
            perm = torch.randperm(im_k.shape[0])
            k = F.normalize(self.encoder_k(im_k[perm]), dim=1)[torch.argsort(perm)]
        negatives = torch.stack(list(self.queue), dim=0).to(q.device)  # [K, dim] oldest first
        l_pos = (q * k).sum(dim=1, keepdim=True)
        l_neg = q @ negatives.t()
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        self.queue.extend(k.detach().clone())
        return logits, labels
