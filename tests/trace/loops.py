"""Training loops written the way users write them, each with switches for one seeded bug.

``plain_loop``: the official asymmetric MoCo as a script's loop (global encoders, a [dim, K]
queue tensor and a pointer, the EMA before the key forward). ``per_view_loop``: a symmetric
MoCo v2+ with one queue per view and the EMA after the optimizer step (solo-learn's shape).
Both run on tiny random images so a test takes well under a second.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from moco_ref.trace import MoCoParts, Recording, record_moco

DIM, K, BATCH, M, T = 12, 32, 8, 0.9, 0.2


def encoder() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 32), nn.BatchNorm1d(32), nn.ReLU(),
                         nn.Linear(32, DIM))


def _views(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(BATCH, 3, 4, 4, generator=generator)
    noise = [0.1 * torch.randn(x.shape, generator=generator) for _ in range(2)]
    return x + noise[0], x + noise[1]


class EmaWrapper(nn.Module):
    """An averaged copy in a wrapper, as mmengine's and timm's EMA classes hold it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = copy.deepcopy(model)

    def forward(self, x):
        return self.module(x)


def _ema(query: nn.Module, key: nn.Module, swapped: bool, data: bool = False) -> None:
    with torch.no_grad():
        for pq, pk in zip(query.parameters(), key.parameters()):
            if data:  # in place through .data: p._version does not move
                pk.data.mul_(M).add_(pq.data, alpha=1 - M)
            elif swapped:
                pk.data = pk.data * (1 - M) + pq.data * M
            else:
                pk.data = pk.data * M + pq.data * (1 - M)


@contextmanager
def _recorded(parts: MoCoParts, late: bool):
    """``record_moco``; ``late``: the recorder starts at the first forward instead (as
    ``moco-ref trace --attach`` does), inside ``optimizer.step``'s closure under
    ``closure=True``."""
    if not late:
        with record_moco(parts) as recording:
            yield recording, lambda: None
        return
    recording, stops = Recording(parts), []

    def attach() -> None:
        if not stops:
            stops.append(recording.start())

    try:
        yield recording, attach
    finally:
        for stop in stops:
            stop()


def plain_loop(steps: int = 8, *, bug: str | None = None, k: int = K, batch: int = BATCH,
               declare: bool = True, seed: int = 0, shuffle: bool = False,
               wrapper: bool = False, order: str = "official", validation: bool = False,
               closure: bool = False, data_ema: bool = False, attach_late: bool = False):
    """The official order in a script's own loop (``order="paper"``: the EMA after the
    optimizer step); ``shuffle``: the key batch goes through the key encoder in a random row
    order and is put back (shuffle BN on one process); ``wrapper``: the key encoder is held by
    an EMA wrapper; ``validation``: an eval-mode pass between steps. Returns the recording."""
    global BATCH
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    query = encoder()
    holder = EmaWrapper(query) if wrapper else copy.deepcopy(query)
    key = holder.module if wrapper else holder
    for p in key.parameters():
        p.requires_grad = bug == "key-trained"
    queue = F.normalize(torch.randn(DIM, k), dim=0)
    pointer = torch.zeros(1, dtype=torch.long)
    optimizer = torch.optim.SGD(query.parameters(), lr=0.5)
    def forward(im_q, im_k):
        """The step's forward, taking the views in image order (``MoCoParts.views``)."""
        q = F.normalize(query(im_q), dim=1)
        if order == "official":
            _ema(query, key, bug == "ema-swapped", data_ema)
        if bug == "key-from-query-view":
            im_k = im_q
        with torch.set_grad_enabled(bug == "key-trained"):
            if shuffle:
                perm = torch.randperm(len(im_k), generator=generator)
                k_ = F.normalize(holder(im_k[perm]), dim=1)[torch.argsort(perm)]
            else:
                k_ = F.normalize(holder(im_k), dim=1)
        positives = (q * k_).sum(dim=1, keepdim=True)
        negatives = q @ queue.clone().detach()
        logits = torch.cat([positives, negatives], dim=1)
        loop.keys = k_
        return q, logits * T if bug == "t-multiplies" else logits / T

    loop = SimpleNamespace(forward=forward, keys=None)
    parts = MoCoParts(query=query, key=holder, queue=lambda: queue, pointer=lambda: pointer,
                      temperature=T if declare else None, momentum=M if declare else None,
                      views=(loop, "forward"))
    old, BATCH = BATCH, batch
    try:
        with _recorded(parts, attach_late) as (recording, attach):
            for _ in range(steps):
                im_q, im_k = _views(generator)
                seen = {}

                def step_closure(im_q=im_q, im_k=im_k, seen=seen):
                    attach()
                    q, logits = loop.forward(im_q, im_k)
                    loss = F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long))
                    optimizer.zero_grad()
                    loss.backward()
                    seen["q"] = q
                    return loss

                if closure:  # the forward inside optimizer.step, as Lightning runs it
                    optimizer.step(step_closure)
                else:
                    step_closure()
                    optimizer.step()
                q = seen["q"]
                written = (q if bug == "enqueue-query" else loop.keys).detach()
                start = int(pointer)
                end = min(start + len(written), k)
                queue[:, start:end] = written[: end - start].T  # drops what does not fit
                if bug != "pointer-stuck":
                    pointer[0] = end % k
                if order == "paper":
                    _ema(query, key, bug == "ema-swapped", data_ema)
                if validation:
                    query.eval()
                    holder.eval()
                    with torch.no_grad():
                        query(_views(generator)[0]), holder(_views(generator)[1])
                    query.train()
                    holder.train()
    finally:
        BATCH = old
    return recording


def per_view_loop(steps: int = 8, *, bug: str | None = None, seed: int = 0,
                  split: bool = False):
    """A symmetric loss, one queue per view ``[2, dim, K]``, the EMA after the optimizer
    step: queue ``v`` holds view ``v``'s keys and is the negatives of the other view's queries.
    ``split``: each encoder is a (backbone, projector) pair, the backbone run on both views
    before the projector runs on either (solo-learn's order)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    query = encoder()
    key = copy.deepcopy(query)
    named_q = (query[:-1], query[-1]) if split else query
    named_k = (key[:-1], key[-1]) if split else key

    def encode(named, views):
        if not split:
            return [F.normalize(named(x), dim=1) for x in views]
        backbone, projector = named
        features = [backbone(x) for x in views]
        return [F.normalize(projector(f), dim=1) for f in features]

    for p in key.parameters():
        p.requires_grad = False
    queue = F.normalize(torch.randn(2, DIM, K), dim=1)
    pointer = torch.zeros(1, dtype=torch.long)
    optimizer = torch.optim.SGD(query.parameters(), lr=0.5)
    parts = MoCoParts(query=named_q, key=named_k, queue=lambda: queue, layout="per-view",
                      pointer=lambda: pointer, temperature=T, momentum=M)

    def half(q, k_, negatives):
        logits = torch.cat([(q * k_).sum(1, keepdim=True), q @ negatives], dim=1) / T
        return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long))

    with record_moco(parts) as recording:
        for _ in range(steps):
            x1, x2 = _views(generator)
            q1, q2 = encode(named_q, (x1, x2))
            with torch.no_grad():
                k1, k2 = encode(named_k, (x1, x2))
            bank = queue.clone().detach()
            if bug == "same-view-queue":
                loss = (half(q1, k2, bank[0]) + half(q2, k1, bank[1])) / 2
            else:
                loss = (half(q1, k2, bank[1]) + half(q2, k1, bank[0])) / 2
            start = int(pointer)
            queue[0][:, start:start + BATCH] = k1.T
            queue[1][:, start:start + BATCH] = k2.T
            pointer[0] = (start + BATCH) % K
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for pq, pk in zip(query.parameters(), key.parameters()):
                    pk.mul_(M).add_(pq, alpha=1 - M)
    return recording
