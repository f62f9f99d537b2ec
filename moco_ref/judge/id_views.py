"""Queue ids that are views of the epoch's order array (grader's process).

A loop that slices its batches from one order array (``ids = order[i:i + B]``,
``torch.from_numpy(order[i:i + B])``) and keeps those slices as its queue's ids, without a
copy, stores views: when the next epoch shuffles the array in place
(``np.random.shuffle(order)``, ``order.copy_(order[perm])``), every id already stored reads
the new order at its slot. What the loop then sees — in its mask, its trace and the
``queue_ids`` it returns — is, for an id enqueued in an earlier epoch, the current epoch's
order at the position its batch row had in its own epoch.

``EpochOrders`` rebuilds that view from the steps followed, so the queue is judged as the
loop held it and I3 names the cause once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EpochOrders:
    """Per arrival (flat, in enqueue order): its ``epoch`` and ``offset`` in that epoch's
    order; per epoch, the ``orders`` (the ids of its steps, in step order); per step its
    ``step_epochs``."""

    epoch: torch.Tensor  # [N]
    offset: torch.Tensor  # [N]
    true_ids: torch.Tensor  # [N]
    orders: list[torch.Tensor]  # [n_e] per epoch
    step_epochs: list[int]

    @classmethod
    def of(cls, arrival_ids: list[torch.Tensor], step_epochs: list[int]) -> EpochOrders:
        epochs, offsets, orders = [], [], []
        for ids, epoch in zip(arrival_ids, step_epochs):
            while len(orders) <= epoch:
                orders.append([])
            start = sum(len(block) for block in orders[epoch])
            orders[epoch].append(ids.to(torch.int64))
            epochs.append(torch.full((len(ids),), epoch, dtype=torch.int64))
            offsets.append(torch.arange(start, start + len(ids)))
        empty = torch.empty(0, dtype=torch.int64)
        return cls(torch.cat(epochs) if epochs else empty,
                   torch.cat(offsets) if offsets else empty,
                   torch.cat(arrival_ids).to(torch.int64) if arrival_ids else empty,
                   [torch.cat(blocks) if blocks else empty for blocks in orders],
                   list(step_epochs))

    def seen(self, positions: torch.Tensor, step: int) -> torch.Tensor:
        """The ids ``[n]`` of the arrivals ``positions`` ``[n]`` as the loop read them during
        ``step``: those of an earlier epoch through the current epoch's order."""
        current = self.step_epochs[step]
        order = self.orders[current]
        earlier = (self.epoch[positions] < current) & (self.offset[positions] < len(order))
        ids = self.true_ids[positions].clone()
        ids[earlier] = order[self.offset[positions][earlier]]
        return ids

    def explains(self, positions: torch.Tensor, ids: torch.Tensor) -> bool:
        """Whether the returned ``ids`` of the entries ``positions`` are their arrivals' ids
        read through the last epoch's order, and not their own."""
        if len(positions) == 0 or not bool((positions >= 0).all()) \
                or ids.shape != positions.shape or len(set(self.step_epochs)) < 2:
            return False
        return (torch.equal(self.seen(positions, len(self.step_epochs) - 1), ids.to(torch.int64))
                and not torch.equal(self.true_ids[positions], ids.to(torch.int64)))
