"""A ring-buffer LAB 07 solution whose loss is a torch.nn.CrossEntropyLoss(label_smoothing=0.2)
reused from the course's classifier lab, in both the warm-up and the queue branch: a fifth of
the target is spread over every column instead of the whole of it on the positive."""
import copy

import numpy as np
import torch
import torch.nn.functional as F

SEED = 3


def views(batch):
    return batch.flip(-1) if torch.rand(()) < 0.5 else batch


class Ring:
    def __init__(self, capacity, dim):
        self.keys = torch.zeros(capacity, dim)
        self.ids = torch.full((capacity,), -1, dtype=torch.long)
        self.ptr, self.size, self.capacity = 0, 0, capacity

    def filled(self):
        return self.keys[: self.size], self.ids[: self.size]

    def push(self, keys, ids):
        slots = (self.ptr + torch.arange(len(keys))) % self.capacity
        self.keys[slots] = keys
        self.ids[slots] = ids
        self.ptr = (self.ptr + len(keys)) % self.capacity
        self.size = min(self.size + len(keys), self.capacity)

    def oldest_first(self):
        if self.size < self.capacity:
            return self.filled()
        order = (self.ptr + torch.arange(self.capacity)) % self.capacity
        return self.keys[order], self.ids[order]


def moco_warmup():
    q = np.array([1.0, 0.0])
    k = np.array([[0.8, 0.2], [0.0, 1.0], [-1.0, 0.0]])
    k = k / np.sqrt((k ** 2).sum(axis=1, keepdims=True))
    out = {}
    for t in [0.1, 0.5]:
        z = k @ q / t
        e = np.exp(z - np.max(z))
        out[str(t)] = list(e / e.sum())
    ring, ptr = ["a", "b", "c", "d"], 0
    for letter in "ef":
        ring[ptr] = letter
        ptr = (ptr + 1) % 4
    fifo = ring[ptr:] + ring[:ptr]
    ema = np.array([0.0, 2.0]) + 0.1 * (np.array([2.0, 4.0]) - np.array([0.0, 2.0]))
    return {"temperature_probabilities": out, "FIFO": fifo, "EMA": ema.tolist()}


def train_moco(initial, x, train, epochs=15):
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.2)  # as in the classifier lab
    torch.manual_seed(SEED + 2)
    query = copy.deepcopy(initial)
    key = copy.deepcopy(initial)
    for p in key.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam(query.parameters(), lr=0.003)
    m, T = 0.99, 0.2
    ring = Ring(128, 24)
    history, trace = [], []
    w0 = list(query.encoder.parameters())[0].detach().clone()
    train = torch.as_tensor(np.asarray(train))
    for _ in range(epochs):
        losses = []
        for ids in train[torch.randperm(len(train))].split(64):
            a, b = views(x[ids]), views(x[ids])
            q = F.normalize(query(a)[1], dim=1)
            with torch.no_grad():
                torch._foreach_lerp_(list(key.parameters()), list(query.parameters()), 1 - m)
                k = F.normalize(key(b)[1], dim=1)
            stored, stored_ids = ring.filled()
            if ring.size == 0:
                loss = criterion(q @ k.T / T, torch.arange(len(ids)))
            else:
                pos = (q * k).sum(1, keepdim=True)
                neg = (q @ stored.T).masked_fill(ids[:, None] == stored_ids[None, :], -1e9)
                labels = torch.zeros(len(ids), dtype=torch.long)
                loss = criterion(torch.cat([pos, neg], 1) / T, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ring.push(k, ids)
            losses.append(loss.item())
            if len(trace) < 5:
                _, held = ring.oldest_first()
                trace.append({"step": len(trace), "queue_size": ring.size,
                              "first_source_id": int(held[0]), "last_source_id": int(held[-1])})
        history.append(float(np.mean(losses)))
    queue, queue_ids = ring.oldest_first()
    drift = float(torch.linalg.norm(list(query.encoder.parameters())[0].detach() - w0))
    return query, key, queue, queue_ids, history, trace, drift
