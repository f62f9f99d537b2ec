"""LAB 07 MoCo (the paper's order, SGD) with a symmetric warm-up: while the queue is empty the
in-batch logits are stacked with their transpose and both directions share one cross-entropy,
`F.cross_entropy(cat([q·kᵀ, k·qᵀ]) / t, cat([arange, arange]))`. MoCo's warm-up is one
direction only (each query against the batch's keys); this averages in keys told their query.
"""
import copy

import numpy as np
import torch
import torch.nn.functional as F

SEED = 0


def views(batch):
    return batch + 0.05 * torch.randn_like(batch)


def moco_warmup():
    q = torch.tensor([1.0, 0.0], dtype=torch.float64)
    keys = torch.tensor([[0.8, 0.2], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    keys = F.normalize(keys, dim=1)
    probs = {str(t): torch.softmax(keys @ q / t, dim=0).tolist() for t in (0.1, 0.5)}
    queue = ["a", "b", "c", "d"]
    for letter in ["e", "f"]:
        queue = queue[1:] + [letter]
    key_param, query_param = np.array([0.0, 2.0]), np.array([2.0, 4.0])
    ema = 0.9 * key_param + 0.1 * query_param
    return {"temperature_probabilities": probs, "FIFO": queue, "EMA": list(ema)}


@torch.no_grad()
def momentum_step(key, query, m):
    for p_k, p_q in zip(key.parameters(), query.parameters()):
        p_k.data = m * p_k.data + (1.0 - m) * p_q.data


def info_nce(q, k, queue, queue_ids, ids, t):
    if queue.shape[0] == 0:  # warm-up: the other keys of the batch are the negatives
        scores = q @ k.T
        both = torch.cat([scores, scores.T]) / t
        return F.cross_entropy(both, torch.arange(q.shape[0]).repeat(2))
    l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
    l_neg = torch.einsum("nc,kc->nk", q, queue)
    same_source = ids[:, None] == queue_ids[None, :]
    l_neg = torch.where(same_source, torch.full_like(l_neg, float("-inf")), l_neg)
    logits = torch.cat([l_pos, l_neg], dim=1) / t
    return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long))


def train_moco(initial, x, train, epochs=15):
    torch.manual_seed(SEED + 2)
    query, key = copy.deepcopy(initial), copy.deepcopy(initial)
    key.requires_grad_(False)
    optimizer = torch.optim.SGD(query.parameters(), lr=0.05, momentum=0.9)
    m, capacity, t = 0.9, 240, 0.2
    queue, queue_ids = torch.zeros(0, 24), torch.zeros(0, dtype=torch.long)
    history, trace = [], []
    first = next(query.encoder.parameters())
    first_before = first.detach().clone()
    order = torch.as_tensor(train)
    for _ in range(epochs):
        total, count = 0.0, 0
        for ids in order[torch.randperm(len(order))].split(60):
            im_q, im_k = views(x[ids]), views(x[ids])
            q = F.normalize(query(im_q)[1], dim=1)
            with torch.no_grad():
                k = F.normalize(key(im_k)[1], dim=1)
            loss = info_nce(q, k, queue, queue_ids, ids, t)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            momentum_step(key, query, m)
            queue = torch.cat([queue, k.detach()], dim=0)[-capacity:]
            queue_ids = torch.cat([queue_ids, ids], dim=0)[-capacity:]
            total, count = total + loss.item(), count + 1
            if len(trace) < 5:
                trace.append({"step": len(trace), "queue_size": len(queue),
                              "first_source_id": int(queue_ids[0]),
                              "last_source_id": int(queue_ids[-1])})
        history.append(total / count)
    drift = (next(query.encoder.parameters()).detach() - first_before).norm().item()
    return query, key, queue, queue_ids, history, trace, drift
