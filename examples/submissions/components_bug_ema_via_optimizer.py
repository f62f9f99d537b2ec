"""MoCo's parts in the components protocol with one bug: momentum_update is written
as an SGD step, θk ← θk − (1 − m)·(θk − θq), by storing θk − θq in each key parameter's .grad
and calling optimizer.step(). The values are the EMA's, but the key parameters are left
holding a .grad — the key encoder now looks like it receives gradients (and any optimizer over
it would apply them).

Expected to fail: I1-key-grads-none.
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


def momentum_update(key_model, query_model, m):
    # The EMA is a gradient step of size (1 - m) toward the query parameters.
    for p_k, p_q in zip(key_model.parameters(), query_model.parameters()):
        p_k.grad = (p_k - p_q).detach()
    torch.optim.SGD(key_model.parameters(), lr=1 - m).step()


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
