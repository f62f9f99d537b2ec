"""The backbone-and-neck MoCo module whose momentum update walks the backbones only: the key
encoder's neck keeps the weights it was copied with while the query's neck trains, so the
keys come from a projection that never follows the query encoder."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Neck(nn.Module):
    def __init__(self, width, dim, hidden=False):
        super().__init__()
        layers = [nn.Linear(width, width), nn.ReLU(inplace=True)] if hidden else []
        self.layers = nn.Sequential(*layers, nn.Linear(width, dim))

    def forward(self, features):
        return self.layers(features)


class InfoNCEHead(nn.Module):
    def __init__(self, temperature):
        super().__init__()
        self.temperature = temperature

    def forward(self, positive, negatives):
        logits = torch.cat([positive, negatives], dim=1) / self.temperature
        target = logits.new_zeros(logits.shape[0], dtype=torch.long)
        return F.cross_entropy(logits, target)


def backbone_with_neck(base_encoder, dim, hidden):
    backbone = base_encoder(num_classes=dim)
    width = backbone.fc.in_features
    backbone.fc = nn.Identity()
    return nn.Sequential(backbone, Neck(width, dim, hidden))


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=65536, m=0.999, T=0.07, mlp=False):
        super().__init__()
        self.K, self.m = K, m
        self.encoder_q = backbone_with_neck(base_encoder, dim, mlp)
        self.encoder_k = backbone_with_neck(base_encoder, dim, mlp)
        self.head = InfoNCEHead(T)
        for online, target in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            target.data.copy_(online.data)
            target.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        backbone_q, backbone_k = self.encoder_q[0], self.encoder_k[0]
        for online, target in zip(backbone_q.parameters(), backbone_k.parameters()):
            target.mul_(self.m).add_(online.detach(), alpha=1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        count = keys.shape[0]
        start = int(self.queue_ptr)
        assert self.K % count == 0
        self.queue[:, start:start + count] = keys.t()
        self.queue_ptr[0] = (start + count) % self.K

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)  # [N, dim]
        with torch.no_grad():
            self._momentum_update_key_encoder()
            order = torch.randperm(im_k.shape[0])
            k = F.normalize(self.encoder_k(im_k[order]), dim=1)[torch.argsort(order)]
        positive = (q * k).sum(dim=1, keepdim=True)  # [N, 1]
        negatives = q @ self.queue.clone().detach()  # [N, K]
        loss = self.head(positive, negatives)
        self._dequeue_and_enqueue(k)
        return loss
