"""MoCo's parts in the components protocol with one bug: KeyQueue keeps `keys.detach()`
rows, assuming detach() copies. It does not: the rows are views of the caller's tensor, so
when the caller reuses its buffer the "stored" keys (and ids) change with it.

Expected to fail: I2-entries-are-arrival-keys.
"""
import torch
import torch.nn.functional as F


class KeyQueue:
    def __init__(self, capacity, dim, dtype=torch.float32):
        self.capacity, self.dim, self.dtype = capacity, dim, dtype
        self._rows = []  # (key, id) pairs, oldest first

    def enqueue(self, keys, ids):
        keys = keys.detach()  # detached, so safe to keep
        for key, source in zip(keys, ids):
            self._rows.append((key, source))
        self._rows = self._rows[-self.capacity:]

    @property
    def keys(self):
        if not self._rows:
            return torch.zeros(0, self.dim, dtype=self.dtype)
        return torch.stack([key for key, _ in self._rows])

    @property
    def ids(self):
        if not self._rows:
            return torch.zeros(0, dtype=torch.long)
        return torch.stack([source for _, source in self._rows]).long()

    def __len__(self):
        return len(self._rows)


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
