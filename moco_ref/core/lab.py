"""LAB 07's ``train_moco`` on top of the reference trainer.

The training step (query forward, EMA, key forward without autograd, masked InfoNCE against
the FIFO dictionary, query update, enqueue) is ``moco_ref.core.step.MoCoTrainer``'s; this module
only adds LAB 07's outer loop (seeded epochs of shuffled batches, two views per batch, Adam)
and its return value ``(query, key, queue, queue_ids, history, trace, drift)``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from moco_ref.core.step import ORDERS, MoCoTrainer
from moco_ref.core.validation import (
    require_count,
    require_ids,
    require_positive,
    require_probability,
    require_tensor,
)

TRACED_STEPS = 5  # LAB 07 records the queue after each of the first five steps

Views = Callable[[torch.Tensor], torch.Tensor]
EpochCallback = Callable[[int, float, int], None]  # (epoch index, mean loss, queue size)


def train_moco(
    initial: nn.Module,
    x: torch.Tensor,
    train: Sequence[int] | torch.Tensor,
    epochs: int = 15,
    *,
    order: str = "lab",
    m: float = 0.95,
    temperature: float = 0.2,
    capacity: int = 240,
    batch_size: int = 60,
    lr: float = 0.002,
    seed: int = 0,
    views: Views | None = None,
    on_epoch_end: EpochCallback | None = None,
) -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor, list[float], list[dict], float]:
    """Train a MoCo query encoder on the images ``x[train]``; return LAB 07's tuple.

    ``initial`` is copied twice (query and key encoders) and left untouched; ``initial(x)``
    returns ``(features, projection)`` or the projection alone, and ``initial.encoder`` is
    the submodule whose first parameter's change is reported as ``drift``. ``x`` is indexed
    by the source ids in ``train`` (``[N, ...]``). Each epoch shuffles ``train`` with a
    generator seeded from ``seed`` and cuts it into batches of ``batch_size`` (the last one
    may be smaller). ``views(batch)`` is called twice per batch, query view first; by
    default it is ``moco_ref.core.views.make_views(seed + 1)`` (needs torchvision).

    Returns ``query``, ``key`` (the trained encoders), ``queue`` ``[n, d]`` oldest first,
    ``queue_ids`` ``[n]`` int64, ``history`` (mean loss per epoch), ``trace`` (queue size and
    first/last source id after each of the first five steps) and ``drift``. With
    ``order="paper"`` the key encoder has had one more EMA after the last step; everything
    else matches ``order="lab"``.
    """
    _require_encoder_model(initial)
    x = require_tensor("x", x)
    if x.ndim < 2 or not x.is_floating_point():
        raise ValueError(
            f"x must be a floating-point tensor of shape [N, ...], got {x.dtype} {list(x.shape)}"
        )
    train = _require_train_ids(train, len(x))
    epochs = require_count("epochs", epochs)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    m = require_probability("m", m)
    temperature = require_positive("temperature", temperature)
    capacity = require_count("capacity", capacity)
    batch_size = require_count("batch_size", batch_size)
    lr = require_positive("lr", lr)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if views is None:
        from moco_ref.core.views import make_views

        views = make_views(seed + 1, image_size=x.shape[-1])
    if not callable(views):
        raise TypeError(f"views must be callable as views(batch) -> batch, got {views!r}")
    if on_epoch_end is not None and not callable(on_epoch_end):
        raise TypeError(f"on_epoch_end must be callable, got {on_epoch_end!r}")

    query, key = copy.deepcopy(initial), copy.deepcopy(initial)
    optimizer = torch.optim.Adam(query.parameters(), lr=lr)
    trainer = MoCoTrainer(
        query, optimizer, m=m, temperature=temperature, capacity=capacity, order=order,
        key_encoder=key,
    )
    watched = next(query.encoder.parameters())
    watched_before = watched.detach().clone()
    shuffler = torch.Generator().manual_seed(seed)
    history: list[float] = []
    trace: list[dict] = []
    for epoch in range(epochs):
        losses = []
        shuffled = train[torch.randperm(len(train), generator=shuffler)]  # [len(train)]
        for ids in shuffled.split(batch_size):  # [B], the last one maybe ragged
            items = x[ids]
            view_q, view_k = views(items), views(items)
            result = trainer.step(view_q, view_k, ids)
            losses.append(float(result.loss))
            if len(trace) < TRACED_STEPS:
                trace.append(_trace_entry(len(trace), trainer))
        history.append(sum(losses) / len(losses))
        if on_epoch_end is not None:
            on_epoch_end(epoch, history[-1], len(trainer.queue))
    drift = float((watched.detach() - watched_before).norm())
    return query, key, trainer.queue.keys, trainer.queue.ids, history, trace, drift


def _trace_entry(step: int, trainer: MoCoTrainer) -> dict:
    queue_ids = trainer.queue.ids  # [n], oldest first
    return {
        "step": step,
        "queue_size": len(trainer.queue),
        "first_source_id": int(queue_ids[0]),
        "last_source_id": int(queue_ids[-1]),
    }


def _require_encoder_model(initial: object) -> None:
    if not isinstance(initial, nn.Module):
        raise TypeError(f"initial must be a torch.nn.Module, got {type(initial).__name__}")
    encoder = getattr(initial, "encoder", None)
    if not isinstance(encoder, nn.Module):
        raise TypeError(
            "initial must have a submodule `encoder` (its first parameter's change is the "
            f"reported drift), got {type(encoder).__name__}"
        )
    if next(encoder.parameters(), None) is None:
        raise ValueError("initial.encoder must have at least one parameter")


def _require_train_ids(train: object, n_items: int) -> torch.Tensor:
    if hasattr(train, "__len__") and len(train) == 0:
        raise ValueError("train must hold at least one index into x, got none")
    train = require_ids("train", train)
    out_of_range = train[(train < 0) | (train >= n_items)]
    if len(out_of_range):
        raise ValueError(
            f"train must index x (0 <= i < {n_items}), got {out_of_range[:8].tolist()}"
        )
    if len(torch.unique(train)) != len(train):
        raise ValueError("train must not repeat an index: each source id is one image")
    return train
