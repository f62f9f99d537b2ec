"""The MoCo dictionary: a FIFO queue of (key vector, source id) pairs.

The FIFO rule lives here and nowhere else: after an enqueue, the queue holds the last
``capacity`` keys in arrival order, each with the id of the image it came from.
"""

from __future__ import annotations

import torch

from moco_ref.core.validation import require_count, require_ids, require_matrix


class KeyQueue:
    """Preallocated ring buffer of keys ``[capacity, dim]`` and their source ids ``[capacity]``.

    ``enqueue`` writes ``B`` rows at the write pointer, so it costs O(B * dim) whatever the
    capacity. Stored keys are detached copies: an entry keeps the exact value it had when
    it arrived, whatever happens later to the encoder that produced it (invariant I2).
    """

    def __init__(
        self,
        capacity: int,
        dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.capacity = require_count("capacity", capacity)
        self.dim = require_count("dim", dim)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        # [K, d] and [K]; a slot is read only after it has been written
        self._keys = torch.empty(self.capacity, self.dim, dtype=dtype, device=device)
        self._ids = torch.empty(self.capacity, dtype=torch.int64, device=device)
        self._ptr = 0  # slot that the next key is written to (the oldest slot once full)
        self._size = 0

    @classmethod
    def over_storage(
        cls, keys: torch.Tensor, ids: torch.Tensor, ptr: int, size: int
    ) -> KeyQueue:
        """A queue that reads and writes existing ring storage in place: ``keys``
        ``[capacity, dim]`` (may be a transposed view of a ``[dim, K]`` buffer), ``ids``
        ``[capacity]`` int64, the write pointer and the number of filled slots."""
        if keys.ndim != 2 or not keys.is_floating_point():
            raise ValueError(f"keys storage must be a floating [capacity, dim] tensor, got "
                             f"{keys.dtype} {list(keys.shape)}")
        if ids.shape != keys.shape[:1] or ids.dtype != torch.int64:
            raise ValueError(f"ids storage must be int64 [{keys.shape[0]}], got "
                             f"{ids.dtype} {list(ids.shape)}")
        if not (0 <= ptr < keys.shape[0] and 0 <= size <= keys.shape[0]):
            raise ValueError(f"ptr {ptr} and size {size} must fit capacity {keys.shape[0]}")
        if size < keys.shape[0] and ptr != size:
            raise ValueError(f"a queue that is not full fills slots 0..size-1, so ptr must "
                             f"equal size {size}, got ptr {ptr}")
        queue = cls.__new__(cls)
        queue.capacity, queue.dim = keys.shape
        queue._keys, queue._ids, queue._ptr, queue._size = keys, ids, ptr, size
        return queue

    @property
    def ptr(self) -> int:
        """The slot the next key is written to; once the queue is full, the oldest entry."""
        return self._ptr

    @property
    def dtype(self) -> torch.dtype:
        return self._keys.dtype

    @property
    def device(self) -> torch.device:
        return self._keys.device

    def __len__(self) -> int:
        return self._size

    @property
    def is_full(self) -> bool:
        return self._size == self.capacity

    @property
    def keys(self) -> torch.Tensor:
        """A copy of the stored keys, oldest first: ``[len(self), dim]``."""
        return self._in_arrival_order(self._keys)

    @property
    def ids(self) -> torch.Tensor:
        """A copy of the stored source ids, oldest first: ``[len(self)]`` int64."""
        return self._in_arrival_order(self._ids)

    def enqueue(self, keys: torch.Tensor, ids: torch.Tensor) -> None:
        """Append ``keys`` ``[B, dim]`` with their source ``ids`` ``[B]``; drop the oldest.

        A batch larger than the capacity leaves only its own last ``capacity`` keys.
        """
        keys = require_matrix("keys", keys, dim=self.dim)
        if keys.dtype != self.dtype:
            raise TypeError(f"keys must have the queue's dtype {self.dtype}, got {keys.dtype}")
        ids = require_ids("ids", ids, length=keys.shape[0])
        keys, ids = keys.detach(), ids.to(self.device)
        if keys.shape[0] > self.capacity:
            keys, ids = keys[-self.capacity :], ids[-self.capacity :]
        batch = keys.shape[0]
        slots = (self._ptr + torch.arange(batch, device=self.device)) % self.capacity  # [B]
        self._keys.index_copy_(0, slots, keys.to(self.device))
        self._ids.index_copy_(0, slots, ids)
        self._ptr = (self._ptr + batch) % self.capacity
        self._size = min(self._size + batch, self.capacity)

    def _in_arrival_order(self, storage: torch.Tensor) -> torch.Tensor:
        if not self.is_full:
            return storage[: self._size].clone()
        return torch.cat([storage[self._ptr :], storage[: self._ptr]])

    def __repr__(self) -> str:
        return (
            f"KeyQueue(capacity={self.capacity}, dim={self.dim}, dtype={self.dtype}, "
            f"len={len(self)})"
        )
