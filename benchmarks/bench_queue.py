"""Enqueue cost against capacity: KeyQueue's ring buffer and LAB 07's concatenate-and-slice."""

import pytest
import torch

from moco_ref import KeyQueue

DIM, BATCH = 128, 256
CAPACITIES = [1024, 4096, 16384, 65536, 262144]


class ConcatQueue:
    """The concatenate-and-slice queue LAB 07 uses, for comparison."""

    def __init__(self, capacity, dim):
        self.capacity = capacity
        self.keys = torch.zeros(capacity, dim)
        self.ids = torch.zeros(capacity, dtype=torch.int64)

    def enqueue(self, keys, ids):
        self.keys = torch.cat([self.keys, keys])[-self.capacity :]
        self.ids = torch.cat([self.ids, ids])[-self.capacity :]


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("kind", ["KeyQueue", "concat"])
def test_enqueue(benchmark, kind, capacity):
    benchmark.group = f"enqueue capacity={capacity}"
    queue = KeyQueue(capacity, DIM) if kind == "KeyQueue" else ConcatQueue(capacity, DIM)
    keys, ids = torch.randn(BATCH, DIM), torch.arange(BATCH)
    queue.enqueue(torch.randn(capacity, DIM), torch.arange(capacity))
    benchmark(queue.enqueue, keys, ids)
    assert len(queue.ids) == capacity
