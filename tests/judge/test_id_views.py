"""Queue ids kept as views of an order array that later epochs shuffle in place
(``judge.id_views``): what the loop reads, derived by hand."""

from __future__ import annotations

import torch

from moco_ref.judge.id_views import EpochOrders

# two epochs over images 10–13, two steps of two each: epoch 0's order [10, 11, 12, 13],
# epoch 1's [13, 10, 12, 11]; arrivals 0–3 in epoch 0, 4–7 in epoch 1
ARRIVALS = [torch.tensor([10, 11]), torch.tensor([12, 13]), torch.tensor([13, 10]),
            torch.tensor([12, 11])]
EPOCHS = [0, 0, 1, 1]


def test_an_earlier_epoch_s_ids_read_the_current_epoch_s_order_at_their_slot():
    orders = EpochOrders.of(ARRIVALS, EPOCHS)
    everything = torch.arange(8)
    assert orders.seen(everything[:4], 1).tolist() == [10, 11, 12, 13]  # still epoch 0
    # during epoch 1, arrival 0 (slot 0 of epoch 0) reads epoch 1's slot 0: 13, and so on
    assert orders.seen(everything, 3).tolist() == [13, 10, 12, 11, 13, 10, 12, 11]


def test_the_returned_ids_are_explained_only_when_they_are_views():
    orders = EpochOrders.of(ARRIVALS, EPOCHS)
    kept = torch.tensor([2, 3, 4, 5, 6, 7])  # a queue of the last 6 arrivals
    assert orders.explains(kept, torch.tensor([12, 11, 13, 10, 12, 11]))
    assert not orders.explains(kept, torch.tensor([12, 13, 13, 10, 12, 11]))  # copies
    assert not orders.explains(kept, torch.tensor([11, 12, 13, 10, 12, 11]))  # another fault
    one_epoch = EpochOrders.of(ARRIVALS[:2], EPOCHS[:2])
    assert not one_epoch.explains(torch.tensor([0, 1, 2, 3]), torch.tensor([10, 11, 12, 13]))
