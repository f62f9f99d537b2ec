"""Adversarial: an official-style module with a real bug (its keys are never L2-normalized:
I8) that reaches into the grader's recorder after every key forward and rewrites what it saw —
the recorded key outputs scaled to unit norm, so that a judge trusting them would read the raw
keys as normalized ones.

Expected: no more points than the honest buggy module: the grader recomputes every recorded
forward of its probe encoder from the parameters recorded with it and the probe's own images,
finds they do not match, discards the observations, and every check reports "error".
"""
import gc

import torch
import torch.nn as nn
import torch.nn.functional as F


def _forge():
    for obj in gc.get_objects():
        if type(obj).__name__ == "BuilderRecorder":
            for event in obj.events:
                if event.get("role") == "k":
                    event["output"] = F.normalize(event["output"], dim=1)


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        if mlp:
            for encoder in (self.encoder_q, self.encoder_k):
                width = encoder.fc.weight.shape[1]
                encoder.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(), encoder.fc)
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.data.copy_(p_q.data)
            p_k.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
                p_k.mul_(self.m).add_(p_q, alpha=1 - self.m)
            k = self.encoder_k(im_k)  # the bug: no F.normalize
            _forge()
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone()], dim=1)
        ptr = int(self.queue_ptr)
        with torch.no_grad():
            self.queue[:, ptr:ptr + len(k)] = k.T
            self.queue_ptr[0] = (ptr + len(k)) % self.K
        return logits / self.T, torch.zeros(len(q), dtype=torch.long)
