"""LAB 07 MoCo with a bug: the keys are normalized into one output tensor reused every step
(`F.normalize(..., out=k_out)`), and the queue keeps `k.T`, a view of that tensor, per batch.

The queue is the newest K columns of a deque of the last batches' key views and their ids.
Every stored view is of the same memory, so each step's keys overwrite every batch already in
the queue: its ids say several batches, its keys are one batch several times.
"""
import collections
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
    k_out = torch.empty(50, 24)  # reused by every batch (the last one may be smaller)
    # enough batches for K keys (a batch may be small), the queue trimmed to the newest K
    key_batches, id_batches = collections.deque(maxlen=K), collections.deque(maxlen=K)
    queue = torch.zeros(24, 0)  # [dim, n]: one key per column
    queue_ids = torch.zeros(0, dtype=torch.int64)
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
                k = F.normalize(encoder_k(im_k)[1], dim=1,
                                out=k_out[:len(ids)])
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
            key_batches.append(k.T)
            id_batches.append(ids)
            queue = torch.cat(list(key_batches), dim=1)[:, -K:]
            queue_ids = torch.cat(list(id_batches))[-K:]
            epoch_loss.append(loss.item())
            if len(trace) < 5:
                trace.append({"step": len(trace), "queue_size": queue.shape[1],
                              "first_source_id": int(queue_ids[0]),
                              "last_source_id": int(queue_ids[-1])})
        history.append(sum(epoch_loss) / len(epoch_loss))
    drift = float((next(iter(encoder_q.encoder.parameters())).detach() - initial_weight).norm())
    return encoder_q, encoder_k, queue.T.contiguous(), queue_ids, history, trace, drift
