"""MoCo's parts in the components protocol plus LAB 07's warm-up, with one bug in the
warm-up's return value: the softmax of the [1, 3] score matrix is returned without taking
its row, so temperature_probabilities['0.1'] is [[p1, p2, p3]] (a list holding one list)
instead of [p1, p2, p3]. The numbers themselves are right.

Expected to fail: warmup-returns-structure (and I5-temperature-probabilities, which reads the
same entry and cannot find 3 numbers in it).
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
    if ids is not None:
        negative = negative.masked_fill(ids[:, None] == queue_ids[None, :], float("-inf"))
    return torch.cat([positive, negative], dim=1) / temperature


def info_nce_loss(logits, labels=None):
    if labels is None:
        labels = torch.zeros(len(logits), dtype=torch.long)
    return F.cross_entropy(logits, labels)


def moco_warmup():
    # Temperature: q = (1, 0) against three L2-normalized candidates (the first is the positive).
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    candidates = torch.tensor([[0.8, 0.2], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    candidates = F.normalize(candidates, dim=1)
    scores = q @ candidates.T  # [1, 3]
    probabilities = {}
    for t in (0.1, 0.5):
        probabilities[str(t)] = torch.softmax(scores / t, dim=1).tolist()

    # FIFO: a full 4-slot queue receives e, f; the two oldest letters fall out.
    capacity = 4
    queue = ["a", "b", "c", "d"]
    queue = (queue + ["e", "f"])[-capacity:]

    # EMA: one step of theta_k <- m * theta_k + (1 - m) * theta_q.
    m = 0.9
    theta_k, theta_q = [0.0, 2.0], [2.0, 4.0]
    ema = [m * k + (1 - m) * q for k, q in zip(theta_k, theta_q)]

    return {"temperature_probabilities": probabilities, "FIFO": queue, "EMA": ema}
