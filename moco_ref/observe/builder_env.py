"""The environment an official-style ``MoCo`` module expects, set up around the ``builder``
probe in the submission's process:

- ``one_process_group()``: a one-process ``torch.distributed`` group (gloo, a ``file://``
  rendezvous in a temporary folder), so code that calls ``all_gather``, ``broadcast`` or
  ``get_rank`` unconditionally runs unchanged; destroyed afterwards. An already initialised
  group (the submission's own) is left alone.
- ``cuda_on_cpu()``: without a GPU, ``Tensor.cuda()`` and ``Module.cuda()`` return the object
  itself, so ``torch.zeros(n).cuda()`` and ``torch.randperm(n).cuda()`` stay on the CPU;
  ``torch.cuda.is_available()`` stays False. Restored afterwards.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

RENDEZVOUS_TIMEOUT = timedelta(seconds=60)


@contextmanager
def one_process_group() -> Iterator[str]:
    """Run the block inside a gloo group of world size 1. Yields what was done: ``"created"``,
    ``"existing"`` (someone else's group), or ``"unavailable: <reason>"`` (the block still
    runs, without a group)."""
    if not dist.is_available():
        yield "unavailable: torch.distributed is not available"
        return
    if dist.is_initialized():
        yield "existing"
        return
    with tempfile.TemporaryDirectory(prefix="moco-ref-group-") as folder:
        try:
            dist.init_process_group(
                "gloo",
                init_method=(Path(folder) / "rendezvous").as_uri(),
                rank=0,
                world_size=1,
                timeout=RENDEZVOUS_TIMEOUT,
            )
        except Exception as exc:  # noqa: BLE001 - grade without a group rather than not at all
            yield f"unavailable: {type(exc).__name__}: {exc}"
            return
        try:
            yield "created"
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def _tensor_cuda(self, device=None, non_blocking=False, memory_format=None):  # noqa: ARG001
    return self


def _module_cuda(self, device=None):  # noqa: ARG001
    return self


@contextmanager
def cuda_on_cpu() -> Iterator[bool]:
    """Map ``.cuda()`` to the CPU for the block when no GPU is present. Yields whether it did."""
    if torch.cuda.is_available():
        yield False
        return
    saved = (torch.Tensor.__dict__.get("cuda"), nn.Module.__dict__.get("cuda"))
    torch.Tensor.cuda = _tensor_cuda
    nn.Module.cuda = _module_cuda
    try:
        yield True
    finally:
        for owner, original in ((torch.Tensor, saved[0]), (nn.Module, saved[1])):
            if original is None:
                delattr(owner, "cuda")
            else:
                owner.cuda = original
