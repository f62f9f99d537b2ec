"""Which image's key each query was paired with after a shuffled key batch
(``judge.key_order``): the rules told apart from what the key encoder ran on, and a ``lab``
run's order read back from its returned queue."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moco_ref.judge import key_order


def test_the_rule_is_read_from_the_rows_the_key_encoder_ran_on():
    rows = [2, 0, 3, 1]  # row r holds image rows[r]
    assert key_order.rule_of([2, 0, 3, 1], rows) == "unshuffle missing"
    assert key_order.rule_of([3, 2, 1, 0], rows) == "shuffled twice"  # rows[rows[j]]
    assert key_order.rule_of([0, 1, 2, 3], rows) is None  # put back: k[argsort(rows)]
    assert key_order.rule_of([1, 0, 2, 3], rows) is None  # no rule explains it
    assert key_order.rule_of([0, 1, 2, 3], [0, 1, 2, 3]) is None  # never shuffled


def _run(steps: int = 3, batch: int = 5, d: int = 4, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = [torch.randperm(100, generator=generator)[:batch] for _ in range(steps)]
    keys = [torch.randn(batch, d, generator=generator, dtype=torch.float64) for _ in ids]
    perms = [torch.randperm(batch, generator=generator) for _ in ids]
    seen = [batch_ids[perm] for batch_ids, perm in zip(ids, perms)]
    return ids, keys, perms, seen


def _queue(ids, keys, orders):
    """What a loop that enqueues its own keys (row j beside the batch's id j) returns."""
    return (F.normalize(torch.cat([k[order] for k, order in zip(keys, orders)]), dim=1),
            torch.cat(ids))


def test_a_lab_queue_tells_which_rule_put_the_keys_back():
    ids, keys, perms, seen = _run()
    for rule, orders in (("shuffled twice", [p[p] for p in perms]),
                         ("unshuffle missing", perms)):
        queue, queue_ids = _queue(ids, keys, orders)
        found = key_order.find_positive_order(ids, keys, seen, queue[-8:], queue_ids[-8:],
                                              atol=1e-9)
        assert found is not None and found.rule == rule
        assert all(torch.equal(a, b) for a, b in zip(found.orders, orders))


def test_keys_put_back_in_image_order_or_never_shuffled_are_no_finding():
    ids, keys, perms, seen = _run()
    queue, queue_ids = _queue(ids, keys, [torch.arange(len(i)) for i in ids])
    assert key_order.find_positive_order(ids, keys, seen, queue, queue_ids, atol=1e-9) is None
    assert key_order.find_positive_order(ids, keys, [None] * len(ids), queue, queue_ids,
                                         atol=1e-9) is None


def test_ids_out_of_step_with_their_keys_by_no_rule_are_left_to_the_queue_checks():
    ids, keys, perms, seen = _run()
    queue, queue_ids = _queue(ids, keys, [torch.arange(len(i)) for i in ids])
    scrambled = queue_ids[torch.randperm(len(queue_ids), generator=torch.Generator()
                                         .manual_seed(5))]
    assert key_order.find_positive_order(ids, keys, seen, queue, scrambled, atol=1e-9) is None
