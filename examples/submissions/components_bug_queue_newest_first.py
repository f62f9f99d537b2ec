"""MoCo's parts in the components protocol with one bug: KeyQueue is a bounded deque
filled with appendleft, so it keeps the right keys (the newest `capacity`) but lists them
newest first instead of oldest first.

Expected to fail: I3-oldest-first-order.
"""
from collections import deque

import torch
import torch.nn.functional as F


class KeyQueue:
    def __init__(self, capacity, dim, dtype=torch.float32):
        self.capacity, self.dim, self.dtype = capacity, dim, dtype
        self._items = deque(maxlen=capacity)  # a full deque drops from the far end

    def enqueue(self, keys, ids):
        for key, source in zip(keys.detach().clone(), ids.tolist()):
            self._items.appendleft((key, int(source)))

    @property
    def keys(self):
        if not self._items:
            return torch.zeros(0, self.dim, dtype=self.dtype)
        return torch.stack([key for key, _ in self._items])

    @property
    def ids(self):
        return torch.tensor([source for _, source in self._items], dtype=torch.long)

    def __len__(self):
        return len(self._items)


@torch.no_grad()
def momentum_update(key_model, query_model, m):
    for p_k, p_q in zip(key_model.parameters(), query_model.parameters()):
        p_k.mul_(m).add_(p_q, alpha=1 - m)


def contrastive_logits(q, k, queue_keys, queue_ids, ids, temperature):
    positive = (q * k).sum(dim=1, keepdim=True)
    negative = q @ queue_keys.T
    if ids is not None:
        negative = negative.masked_fill(ids[:, None] == queue_ids[None, :], float("-inf"))
    return torch.cat([positive, negative], dim=1) / temperature


def info_nce_loss(logits, labels=None):
    if labels is None:
        labels = torch.zeros(len(logits), dtype=torch.long)
    return F.cross_entropy(logits, labels)
