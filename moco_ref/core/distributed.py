"""Cross-process helpers for MoCo on ``torch.distributed``: gathering keys in rank order and
shuffle-BN. Without an initialised process group every helper is the identity, so the same
code runs in one process unchanged."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


@torch.no_grad()
def concat_all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` ``[B, ...]`` concatenated in rank order: ``[world·B, ...]``.

    No gradient flows through the gather. Every rank must pass the same shape.
    """
    if not is_distributed():
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=0)


@torch.no_grad()
def shuffle_batch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shuffle-BN, first half: redistribute the global batch across ranks with a permutation
    drawn on rank 0 and broadcast, so BatchNorm statistics in the key encoder mix images
    from other ranks. Returns this rank's shuffled slice ``[B, ...]`` and the index that
    undoes the permutation ``[world·B]``."""
    if not is_distributed():
        return x, torch.arange(len(x), device=x.device)
    gathered = concat_all_gather(x)  # [world·B, ...]
    permutation = torch.randperm(len(gathered), device=x.device)
    dist.broadcast(permutation, src=0)
    undo = torch.argsort(permutation)
    mine = permutation.view(dist.get_world_size(), -1)[dist.get_rank()]
    return gathered[mine], undo


@torch.no_grad()
def unshuffle_batch(x: torch.Tensor, undo: torch.Tensor) -> torch.Tensor:
    """Shuffle-BN, second half: give every rank back the outputs of its own images, in its
    original order."""
    if not is_distributed():
        return x[undo]
    gathered = concat_all_gather(x)  # [world·B, ...] in shuffled order
    mine = undo.view(dist.get_world_size(), -1)[dist.get_rank()]
    return gathered[mine]
