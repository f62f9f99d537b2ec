"""LAB 07 MoCo with the official [dim, K] queue layout, started as the official code starts
it but with zeros instead of random keys: `queue = zeros(dim, K)`, grown and cut along dim 1
from the first step. So there is no warm-up (the queue is never empty) and until K keys have
arrived its zero columns are negatives (a logit of 0 each, still counted). AdamW, m = 0.999,
capacity 200, batch 50; returned transposed to [n, dim], oldest first.
"""
import copy

import numpy as np
import torch
import torch.nn.functional as F

SEED = 11


def views(batch):
    return batch + 0.1 * torch.randn_like(batch)


def moco_warmup():
    query = np.array([1.0, 0.0])
    keys = np.array([[0.8, 0.2], [0.0, 1.0], [-1.0, 0.0]])
    keys = keys / np.linalg.norm(keys, axis=1)[:, None]
    probabilities = {}
    for temperature in (0.1, 0.5):
        logits = keys @ query / temperature
        probabilities[str(temperature)] = (np.exp(logits) / np.exp(logits).sum()).tolist()
    from collections import deque
    fifo = deque(["a", "b", "c", "d"], maxlen=4)
    fifo.extend(["e", "f"])
    ema = np.array([0.0, 2.0]) * 0.9 + np.array([2.0, 4.0]) * 0.1
    return {"temperature_probabilities": probabilities, "FIFO": list(fifo), "EMA": ema.tolist()}


def train_moco(initial, x, train, epochs=15):
    torch.manual_seed(SEED + 2)
    encoder_q = copy.deepcopy(initial)
    encoder_k = copy.deepcopy(initial)
    for param_k in encoder_k.parameters():
        param_k.requires_grad = False
    optimizer = torch.optim.AdamW(encoder_q.parameters(), lr=0.001, weight_decay=1e-4)
    K, m, T = 200, 0.999, 0.2
    queue = torch.zeros(24, K)  # [dim, K]: one key per column, zeros until filled
    queue_ids = torch.full((K,), -1, dtype=torch.int64)
    history, trace = [], []
    initial_weight = next(iter(encoder_q.encoder.parameters())).detach().clone()
    train = torch.from_numpy(np.asarray(train))
    for _ in range(epochs):
        epoch_loss = []
        for ids in train[torch.randperm(train.numel())].split(50):
            im_q, im_k = views(x[ids]), views(x[ids])
            q = F.normalize(encoder_q(im_q)[1], dim=1)
            with torch.no_grad():
                for param_q, param_k in zip(encoder_q.parameters(), encoder_k.parameters()):
                    param_k.data.mul_(m).add_(param_q.data, alpha=1.0 - m)
                k = F.normalize(encoder_k(im_k)[1], dim=1)
            if queue.shape[1] == 0:
                logits, labels = torch.mm(q, k.t()) / T, torch.arange(q.shape[0])
            else:
                l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
                l_neg = torch.einsum("nc,ck->nk", [q, queue])
                l_neg[ids.unsqueeze(1) == queue_ids.unsqueeze(0)] = float("-inf")
                logits = torch.cat([l_pos, l_neg], dim=1) / T
                labels = torch.zeros(logits.shape[0], dtype=torch.long)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            queue = torch.cat([queue, k.T], dim=1)[:, -K:]
            queue_ids = torch.cat([queue_ids, ids])[-K:]
            epoch_loss.append(loss.item())
            if len(trace) < 5:
                trace.append({"step": len(trace), "queue_size": queue.shape[1],
                              "first_source_id": int(queue_ids[0]),
                              "last_source_id": int(queue_ids[-1])})
        history.append(sum(epoch_loss) / len(epoch_loss))
    drift = float((next(iter(encoder_q.encoder.parameters())).detach() - initial_weight).norm())
    return encoder_q, encoder_k, queue.T.contiguous(), queue_ids, history, trace, drift
