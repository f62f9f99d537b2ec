"""A single-GPU symmetric MoCo whose each InfoNCE term is multiplied by 2T, as MoCo v3
writes its contrastive loss (the scale keeps gradients of one size whatever the
temperature): forward returns the sum of both halves. A positive scale of the whole loss only
changes the effective learning rate, so this is a correct module."""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=4096, m=0.99, T=0.1, mlp=False, symmetric=True):
        super().__init__()
        self.K, self.m, self.T, self.symmetric = K, m, T, symmetric
        self.encoder_q = base_encoder(num_classes=dim)
        if mlp:
            width = self.encoder_q.fc.in_features
            self.encoder_q.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                              self.encoder_q.fc)
        self.encoder_k = copy.deepcopy(self.encoder_q)
        for p in self.encoder_k.parameters():
            p.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for p_q, p_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            p_k.data = p_k.data * self.m + p_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        # keys: [n, dim]
        n = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % n == 0
        self.queue[:, ptr:ptr + n] = keys.t()
        self.queue_ptr[0] = (ptr + n) % self.K

    @torch.no_grad()
    def _keys(self, images):
        order = torch.randperm(images.shape[0])
        k = F.normalize(self.encoder_k(images[order]), dim=1)
        return k[torch.argsort(order)]  # [N, dim], back in image order

    def contrastive_loss(self, im_a, im_b):
        q = F.normalize(self.encoder_q(im_a), dim=1)  # [N, dim]
        k = self._keys(im_b)  # [N, dim]
        l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        return nn.CrossEntropyLoss()(logits, labels) * (2 * self.T), q, k

    def forward(self, im1, im2):
        with torch.no_grad():
            self._momentum_update_key_encoder()
        if self.symmetric:
            loss_12, q1, k2 = self.contrastive_loss(im1, im2)
            loss_21, q2, k1 = self.contrastive_loss(im2, im1)
            loss = loss_12 + loss_21
            k = torch.cat([k1, k2], dim=0)
        else:
            loss, q, k = self.contrastive_loss(im1, im2)
        self._dequeue_and_enqueue(k)
        return loss
