"""A single-GPU MoCo module that returns log-probabilities as its logits (log_softmax over
each row of [q·k⁺, q·queue]/T): they differ from the logits by one constant per row, so the
official loop's cross-entropy, and so the training, are unchanged."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = nn.Sequential(base_encoder(num_classes=dim))
        self.encoder_k = nn.Sequential(base_encoder(num_classes=dim))
        if mlp:
            for encoder in (self.encoder_q, self.encoder_k):
                width = encoder[0].fc.in_features
                encoder[0].fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(), encoder[0].fc)
        self.encoder_k.load_state_dict(self.encoder_q.state_dict())
        self.encoder_k.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.lerp_(p_q, 1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        n = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % n == 0
        self.queue[:, ptr:ptr + n] = keys.T
        self.queue_ptr[0] = (ptr + n) % self.K

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            k = F.normalize(self.encoder_k(im_k), dim=1)
        l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        logits = F.log_softmax(torch.cat([l_pos, l_neg], dim=1) / self.T, dim=1)
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels
