"""MoCo's parts in the components protocol with one bug: contrastive_logits ignores the
ids and never masks queue entries from the query's own image, so same-source keys are
counted as negatives.

Expected to fail: I4-same-source-masked.
"""
import torch
import torch.nn.functional as F


class KeyQueue:
    def __init__(self, capacity, dim, dtype=torch.float32):
        self.capacity = capacity
        self._keys = torch.zeros(0, dim, dtype=dtype)
        self._ids = torch.zeros(0, dtype=torch.long)

    def enqueue(self, keys, ids):
        self._keys = torch.cat([self._keys, keys.detach().clone()])[-self.capacity:]
        self._ids = torch.cat([self._ids, ids.clone().long()])[-self.capacity:]

    @property
    def keys(self):
        return self._keys.clone()

    @property
    def ids(self):
        return self._ids.clone()

    def __len__(self):
        return len(self._ids)


@torch.no_grad()
def momentum_update(key_model, query_model, m):
    for p_k, p_q in zip(key_model.parameters(), query_model.parameters()):
        p_k.mul_(m).add_(p_q, alpha=1 - m)


def contrastive_logits(q, k, queue_keys, queue_ids, ids, temperature):
    positive = (q * k).sum(dim=1, keepdim=True)
    negative = q @ queue_keys.T
    return torch.cat([positive, negative], dim=1) / temperature


def info_nce_loss(logits, labels=None):
    if labels is None:
        labels = torch.zeros(len(logits), dtype=torch.long)
    return F.cross_entropy(logits, labels)
