"""A MoCo v2 fork that builds its MLP head from the wrong axis of fc.weight: Linear stores its
weight as [out_features, in_features], so shape[0] is dim (the output), not the width of the
features fc receives. With a ResNet-50 (2048 → 128) the head is Linear(128, 128) in front of
an fc that expects 2048 inputs. With mlp=False it is a correct single-GPU module.

Bug: the MLP head's hidden width is fc.weight.shape[0] (dim) instead of shape[1]."""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K = K
        self.m = m
        self.T = T
        self.encoder_q = base_encoder(num_classes=dim)
        if mlp:
            dim_mlp = self.encoder_q.fc.weight.shape[0]
            self.encoder_q.fc = nn.Sequential(nn.Linear(dim_mlp, dim_mlp), nn.ReLU(),
                                              self.encoder_q.fc)
        self.encoder_k = copy.deepcopy(self.encoder_q)
        self.encoder_k.requires_grad_(False)
        queue = torch.randn(dim, K)
        self.register_buffer("queue", queue / queue.norm(dim=0, keepdim=True))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)  # [N, dim]
        with torch.no_grad():
            for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
                p_k.lerp_(p_q, 1.0 - self.m)
            k = F.normalize(self.encoder_k(im_k), dim=1)  # [N, dim]
        logits = torch.cat([(q * k).sum(dim=1, keepdim=True), q @ self.queue.clone()], dim=1)
        labels = torch.zeros(len(q), dtype=torch.long)
        with torch.no_grad():
            ptr = int(self.queue_ptr)
            self.queue[:, ptr:ptr + len(k)] = k.T
            self.queue_ptr[0] = (ptr + len(k)) % self.K
        return logits / self.T, labels
