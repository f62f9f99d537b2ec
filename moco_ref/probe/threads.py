"""Tiny tensors run fastest on one thread: the probe's and the judge's work is thousands of
operations on [60, 24] matrices, where two OpenMP threads mostly wait for each other."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(1)``; restore the previous count after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
