"""MoCo's parts in the components protocol with one bug: contrastive_logits gives
every column a source id — the positive's is the query's own id, the negatives' are the
queue ids — and masks every column whose id equals the query's, so the positive (column 0)
is always masked too.

Expected to fail: I4-positive-never-masked.
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
    logits = torch.cat([positive, negative], dim=1)
    if ids is not None:
        # column 0 is the positive, a view of the query's own image; column 1 + j is queue entry j
        column_ids = torch.cat([ids[:, None], queue_ids[None, :].expand(len(ids), -1)], dim=1)
        logits = logits.masked_fill(column_ids == ids[:, None], float("-inf"))
    return logits / temperature


def info_nce_loss(logits, labels=None):
    if labels is None:
        labels = torch.zeros(len(logits), dtype=torch.long)
    return F.cross_entropy(logits, labels)
