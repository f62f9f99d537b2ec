"""A single-GPU MoCo module with its own split BatchNorm of 32 slices (a batch of at least 32
images per step), whose key batch is "unshuffled" though it was never shuffled.

Bug (two): the key encoder runs on im_k in image order and the keys are then reordered with
argsort(order), so each query's positive is another image's key; and the split BatchNorm needs
a batch that is a multiple of 32. On the probe's smaller batch encoder_q's forward raises first,
so the report says which parts of forward were never reached and why (the key ordering bug
behind the crash cannot be judged at that batch).
"""

import torch
import torch.nn.functional as F
from torch import nn

BN_SPLITS = 32


class SplitBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training-mode statistics are computed per slice of the batch."""

    def __init__(self, num_features, splits, **kwargs):
        super().__init__(num_features, **kwargs)
        self.splits = splits

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        n, c, h, w = x.shape
        if n % self.splits:
            raise ValueError(f"a batch of {n} cannot be split {self.splits} ways")
        mean = self.running_mean.repeat(self.splits)
        var = self.running_var.repeat(self.splits)
        out = F.batch_norm(x.reshape(n // self.splits, c * self.splits, h, w), mean, var,
                           self.weight.repeat(self.splits), self.bias.repeat(self.splits),
                           True, self.momentum, self.eps)
        with torch.no_grad():  # the running statistics: the mean over the slices
            self.running_mean.copy_(mean.view(self.splits, c).mean(dim=0))
            self.running_var.copy_(var.view(self.splits, c).mean(dim=0))
        return out.reshape(n, c, h, w)


def with_split_bn(module, splits):
    """``module`` with every BatchNorm2d replaced in place by a SplitBatchNorm2d."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d) and not isinstance(child, SplitBatchNorm2d):
            split = SplitBatchNorm2d(child.num_features, splits, eps=child.eps,
                                     momentum=child.momentum)
            split.load_state_dict(child.state_dict())
            setattr(module, name, split)
        else:
            with_split_bn(child, splits)
    return module


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=128, K=4096, m=0.99, T=0.1, mlp=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = with_split_bn(base_encoder(num_classes=dim), BN_SPLITS)
        self.encoder_k = with_split_bn(base_encoder(num_classes=dim), BN_SPLITS)
        if mlp:
            for encoder in (self.encoder_q, self.encoder_k):
                width = encoder.fc.in_features
                encoder.fc = nn.Sequential(nn.Linear(width, width), nn.ReLU(), encoder.fc)
        self.encoder_k.load_state_dict(self.encoder_q.state_dict())
        for param in self.encoder_k.parameters():
            param.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for key, query in zip(self.encoder_k.parameters(), self.encoder_q.parameters()):
            key.lerp_(query, 1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        n = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % n == 0
        self.queue[:, ptr:ptr + n] = keys.t()
        self.queue_ptr[0] = (ptr + n) % self.K

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            order = torch.randperm(im_k.shape[0], device=im_k.device)
            k = F.normalize(self.encoder_k(im_k), dim=1)
            k = k[torch.argsort(order)]
        l_pos = (q * k).sum(dim=1, keepdim=True)
        l_neg = q @ self.queue.clone().detach()
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        self._dequeue_and_enqueue(k)
        return logits, labels
