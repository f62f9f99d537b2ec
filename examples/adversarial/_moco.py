"""The MoCo the adversarial examples wrap: LAB 07's train_moco, correct unless ``mask=False``
(then a query's own older keys count as negatives: the I4 bug). Not a submission itself
(a leading underscore keeps the grader from picking it up); the examples import it.

The grader sets ``views`` and ``SEED`` in the *example's* module, so each example passes them
in: ``run(initial, x, train, epochs, views=views, seed=SEED)``.
"""
import copy

import numpy as np
import torch
import torch.nn.functional as F


def moco_warmup():
    query = np.array([1.0, 0.0])
    candidates = np.array([[0.8, 0.2], [0.0, 1.0], [-1.0, 0.0]])
    candidates = candidates / np.linalg.norm(candidates, axis=1, keepdims=True)
    probabilities = {}
    for temperature in (0.1, 0.5):
        scores = candidates @ query / temperature
        weights = np.exp(scores - scores.max())
        probabilities[str(temperature)] = (weights / weights.sum()).tolist()
    fifo = (["a", "b", "c", "d"] + ["e", "f"])[-4:]
    ema = 0.9 * np.array([0.0, 2.0]) + 0.1 * np.array([2.0, 4.0])
    return {"temperature_probabilities": probabilities, "FIFO": fifo, "EMA": ema.tolist()}


def run(initial, x, train, epochs, *, views, seed, mask=True, each_step=None):
    """LAB order (EMA, key forward, loss, update, enqueue), Adam, m = 0.95, capacity 240,
    batch 60. ``each_step(step)`` is called after every step, if given."""
    torch.manual_seed(seed + 2)
    query, key = copy.deepcopy(initial), copy.deepcopy(initial)
    for param in key.parameters():
        param.requires_grad = False
    optimizer = torch.optim.Adam(query.parameters(), lr=0.002)
    m, capacity, batch_size, temperature = 0.95, 240, 60, 0.2
    queue, queue_ids = torch.empty((0, 24)), torch.empty(0, dtype=torch.long)
    history, trace = [], []
    start = next(query.encoder.parameters()).detach().clone()
    train = torch.as_tensor(train)
    step = 0
    for _ in range(epochs):
        losses = []
        for ids in train[torch.randperm(len(train))].split(batch_size):
            view_q, view_k = views(x[ids]), views(x[ids])
            q = F.normalize(query(view_q)[1], dim=1)
            with torch.no_grad():
                for p_k, p_q in zip(key.parameters(), query.parameters()):
                    p_k.mul_(m).add_(p_q, alpha=1 - m)
                k = F.normalize(key(view_k)[1], dim=1)
            if len(queue) == 0:
                logits, labels = q @ k.T / temperature, torch.arange(len(ids))
            else:
                negative = q @ queue.T
                if mask:
                    negative = negative.masked_fill(ids[:, None] == queue_ids[None, :], -1e9)
                logits = torch.cat([(q * k).sum(dim=1, keepdim=True), negative], 1) / temperature
                labels = torch.zeros(len(ids), dtype=torch.long)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                queue = torch.cat([queue, k])[-capacity:]
                queue_ids = torch.cat([queue_ids, ids])[-capacity:]
            losses.append(loss.item())
            if len(trace) < 5:
                trace.append({"step": len(trace), "queue_size": len(queue),
                              "first_source_id": int(queue_ids[0]),
                              "last_source_id": int(queue_ids[-1])})
            if each_step is not None:
                each_step(step)
            step += 1
        history.append(float(np.mean(losses)))
    drift = float((next(query.encoder.parameters()).detach() - start).norm())
    return query, key, queue, queue_ids, history, trace, drift


def stolen_channel_writer():
    """The observer's channel writer, found in memory (its nonce with it): what a submission
    that forges frames starts from."""
    import gc

    return next(o for o in gc.get_objects() if type(o).__name__ == "FrameWriter")
