"""LAB 07 MoCo whose batches are slices of one order tensor, shuffled in place each epoch
(``order.copy_(order[perm])``), and whose queue ids are those slices, kept without a copy.

Bug: every id enqueued in an earlier epoch is a view of ``order``, so after the next shuffle
it reads the new order at its slot: queue_ids (and the mask built from them) pair older keys
with other images' ids.
"""
import copy

import numpy as np
import torch
import torch.nn.functional as F

SEED = 7


def views(batch):
    return batch + 0.1 * torch.randn_like(batch)


def moco_warmup():
    query = np.array([1.0, 0.0])
    candidates = np.array([[0.8, 0.2], [0.0, 1.0], [-1.0, 0.0]])
    candidates = candidates / np.linalg.norm(candidates, axis=1, keepdims=True)
    probabilities = {}
    for temperature in (0.1, 0.5):
        scores = candidates @ query / temperature
        weights = np.exp(scores - scores.max())
        probabilities[str(temperature)] = (weights / weights.sum()).tolist()
    letters = ["a", "b", "c", "d"] + ["e", "f"]
    fifo = letters[-4:]
    theta_k, theta_q, m = np.array([0.0, 2.0]), np.array([2.0, 4.0]), 0.9
    ema = m * theta_k + (1 - m) * theta_q
    return {"temperature_probabilities": probabilities, "FIFO": fifo, "EMA": ema.tolist()}


def train_moco(initial, x, train, epochs=15):
    torch.manual_seed(SEED + 2)
    query = copy.deepcopy(initial)
    key = copy.deepcopy(initial)
    for param in key.parameters():
        param.requires_grad = False
    optimizer = torch.optim.Adam(query.parameters(), lr=0.002)
    m, capacity, batch_size, temperature = 0.95, 240, 60, 0.2
    queue = torch.empty((0, 24))
    queue_ids = torch.empty(0, dtype=torch.long)
    history, trace = [], []
    start = next(query.encoder.parameters()).detach().clone()
    order = torch.as_tensor(train).clone()
    id_blocks = []
    for _ in range(epochs):
        epoch_losses = []
        order.copy_(order[torch.randperm(len(order))])  # shuffled in place
        for ids in order.split(batch_size):
            view_q, view_k = views(x[ids]), views(x[ids])
            q = F.normalize(query(view_q)[1], dim=1)
            with torch.no_grad():
                for p_k, p_q in zip(key.parameters(), query.parameters()):
                    p_k.mul_(m).add_(p_q, alpha=1 - m)
                k = F.normalize(key(view_k)[1], dim=1)
            if len(queue) == 0:
                logits = q @ k.T / temperature
                labels = torch.arange(len(ids))
            else:
                positive = (q * k).sum(dim=1, keepdim=True)
                negative = q @ queue.T
                negative = negative.masked_fill(ids[:, None] == queue_ids[None, :], -1e9)
                logits = torch.cat([positive, negative], dim=1) / temperature
                labels = torch.zeros(len(ids), dtype=torch.long)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                queue = torch.cat([queue, k])[-capacity:]
                id_blocks.append(ids)  # a view of order
                queue_ids = torch.cat(id_blocks)[-capacity:]
            epoch_losses.append(loss.item())
            if len(trace) < 5:
                trace.append({"step": len(trace), "queue_size": len(queue),
                              "first_source_id": int(queue_ids[0]),
                              "last_source_id": int(queue_ids[-1])})
        history.append(float(np.mean(epoch_losses)))
    drift = float((next(query.encoder.parameters()).detach() - start).norm())
    return query, key, queue, queue_ids, history, trace, drift
