"""MoCo's parts in the components protocol with one bug: momentum_update averages the whole
state_dict, so BatchNorm running statistics are pulled toward the query model's too.

Expected to fail: I7.
"""
import torch
import torch.nn.functional as F


class KeyQueue:
    def __init__(self, capacity, dim, dtype=torch.float32):
        self.capacity, self.dim = capacity, dim
        self.items = []  # (key, id) pairs, oldest first

    def enqueue(self, keys, ids):
        for key, source in zip(keys.detach().clone(), ids.tolist()):
            self.items.append((key, int(source)))
        self.items = self.items[-self.capacity:]

    def keys(self):
        if not self.items:
            return torch.zeros(0, self.dim, dtype=torch.float64)
        return torch.stack([key for key, _ in self.items])

    def ids(self):
        return torch.tensor([source for _, source in self.items], dtype=torch.long)

    def __len__(self):
        return len(self.items)


@torch.no_grad()
def momentum_update(key_model, query_model, m):
    query_state = query_model.state_dict()
    for name, value in key_model.state_dict().items():
        if value.is_floating_point():
            value.mul_(m).add_(query_state[name], alpha=1 - m)


def contrastive_logits(q, k, queue_keys, queue_ids, ids, temperature):
    logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue_keys.T], dim=1) / temperature
    if ids is None:
        return logits
    positive = torch.zeros(len(ids), 1, dtype=torch.bool)
    same = torch.cat([positive, ids[:, None] == queue_ids[None, :]], 1)
    return logits.masked_fill(same, -1e9)


def info_nce_loss(logits, labels=None):
    labels = torch.zeros(len(logits), dtype=torch.long) if labels is None else labels
    return -F.log_softmax(logits, dim=1).gather(1, labels[:, None]).mean()
