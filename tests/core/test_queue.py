"""KeyQueue: the FIFO rule (I3) and the never-recomputed entries (I2)."""

import pytest
import torch
from hypothesis import example, given, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from moco_ref import KeyQueue

DIM = 3


class QueueAgainstListModel(RuleBasedStateMachine):
    """Drive KeyQueue with arbitrary batch sizes and compare it with a plain list after
    every step, bitwise: the list keeps every (key, id) ever enqueued and the expected
    queue is its last `capacity` items."""

    @initialize(capacity=st.integers(1, 9))
    def make(self, capacity):
        self.capacity = capacity
        self.queue = KeyQueue(capacity, DIM, dtype=torch.float64)
        self.arrived: list[tuple[list[float], int]] = []
        self.next_id = 0

    @rule(data=st.data())
    def enqueue(self, data):
        batch = data.draw(st.integers(1, 3 * self.capacity), label="batch")
        values = data.draw(
            st.lists(
                st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=DIM, max_size=DIM),
                min_size=batch,
                max_size=batch,
            ),
            label="keys",
        )
        ids = list(range(self.next_id, self.next_id + batch))
        self.next_id += batch
        self.queue.enqueue(torch.tensor(values, dtype=torch.float64), torch.tensor(ids))
        self.arrived += list(zip(values, ids))

    @rule()
    def read_does_not_disturb(self):
        self.queue.keys.fill_(7.0)  # the properties return copies
        self.queue.ids.fill_(-7)

    @invariant()
    def matches_list_model(self):
        if not hasattr(self, "queue"):
            return
        expected = self.arrived[-self.capacity :]
        assert len(self.queue) == len(expected)
        assert self.queue.ids.tolist() == [i for _, i in expected]
        assert self.queue.keys.tolist() == [k for k, _ in expected]  # bitwise: exact floats


TestQueueAgainstListModel = QueueAgainstListModel.TestCase


@given(capacity=st.integers(1, 12), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8))
@example(capacity=4, sizes=[3, 3])  # wraps mid-batch
@example(capacity=4, sizes=[9])  # one batch larger than the capacity
def test_surviving_entries_keep_their_exact_values(capacity, sizes):
    """I2: an entry is never rewritten while it stays in the queue."""
    queue = KeyQueue(capacity, DIM, dtype=torch.float32)
    generator = torch.Generator().manual_seed(capacity)
    next_id = 0
    for size in sizes:
        before = dict(zip(queue.ids.tolist(), queue.keys))
        keys = torch.randn(size, DIM, generator=generator)
        queue.enqueue(keys, torch.arange(next_id, next_id + size))
        next_id += size
        survivors = [i for i in queue.ids.tolist() if i in before]
        note(f"survivors {survivors}")
        for i, key in zip(queue.ids.tolist(), queue.keys):
            if i in before:
                assert torch.equal(key, before[i])


def test_storage_is_preallocated_and_written_in_place():
    """One enqueue writes B rows into the ring; the storage is never reallocated."""
    queue = KeyQueue(5, DIM)
    address = queue._keys.data_ptr()
    for start in range(0, 30, 3):
        queue.enqueue(torch.ones(3, DIM) * start, torch.arange(start, start + 3))
    assert queue._keys.data_ptr() == address
    assert queue.ids.tolist() == [25, 26, 27, 28, 29]


def test_keys_are_stored_detached():
    queue = KeyQueue(4, DIM)
    leaf = torch.ones(2, DIM, requires_grad=True)
    queue.enqueue(leaf * 2, torch.tensor([0, 1]))
    assert queue.keys.grad_fn is None and not queue.keys.requires_grad


def test_ids_accept_sequences_and_smaller_integer_dtypes():
    queue = KeyQueue(4, DIM)
    queue.enqueue(torch.zeros(2, DIM), [3, 4])
    queue.enqueue(torch.zeros(1, DIM), torch.tensor([5], dtype=torch.int32))
    assert queue.ids.dtype == torch.int64 and queue.ids.tolist() == [3, 4, 5]


@pytest.mark.parametrize(
    ("keys", "ids", "error", "needle"),
    [
        (torch.zeros(2, DIM + 1), [0, 1], ValueError, "3 columns"),
        (torch.zeros(DIM), [0], ValueError, "shape [rows, dim]"),
        (torch.zeros(2, DIM), [0], ValueError, "one id per key"),
        (torch.zeros(2, DIM), torch.tensor([0.0, 1.0]), TypeError, "integer ids"),
        (torch.zeros(2, DIM), torch.tensor([[0, 1]]), ValueError, "shape [B]"),
        (torch.tensor([[0.0, float("nan"), 0.0]]), [0], ValueError, "NaN or inf"),
        (torch.zeros(2, DIM, dtype=torch.float64), [0, 1], TypeError, "queue's dtype"),
        (torch.zeros(2, DIM, dtype=torch.int64), [0, 1], TypeError, "floating-point"),
        ([[0.0, 0.0, 0.0]], [0], TypeError, "torch.Tensor"),
    ],
)
def test_enqueue_rejects_bad_input(keys, ids, error, needle):
    queue = KeyQueue(4, DIM)
    with pytest.raises(error, match=needle.replace("[", r"\[").replace("]", r"\]")):
        queue.enqueue(keys, ids)
    assert len(queue) == 0  # nothing half-written


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"capacity": 0, "dim": 3}, ValueError),
        ({"capacity": 2, "dim": 0}, ValueError),
        ({"capacity": 2.0, "dim": 3}, TypeError),
        ({"capacity": 2, "dim": 3, "dtype": torch.int64}, TypeError),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        KeyQueue(**kwargs)


@pytest.mark.parametrize(("ptr", "size"), [(0, 0), (2, 2), (3, 4), (1, 4)])
def test_over_storage_reads_and_writes_the_given_ring_in_place(ptr, size):
    """A queue over existing storage starts with `size` entries ending just before `ptr`
    (slots 0..size-1 while not full) and writes its next keys into that same storage."""
    keys = torch.arange(12, dtype=torch.float64).reshape(4, DIM)  # slot s holds 3s, 3s+1, 3s+2
    ids = torch.tensor([10, 11, 12, 13])
    queue = KeyQueue.over_storage(keys, ids, ptr, size)
    filled = [(ptr - size + i) % 4 for i in range(size)]  # oldest first
    assert len(queue) == size and queue.ptr == ptr
    assert queue.ids.tolist() == [10 + slot for slot in filled]
    assert queue.keys.tolist() == [[3.0 * slot + j for j in range(DIM)] for slot in filled]
    queue.enqueue(torch.full((1, DIM), -1.0, dtype=torch.float64), torch.tensor([99]))
    assert keys[ptr].tolist() == [-1.0] * DIM and ids[ptr] == 99
    assert len(queue) == min(size + 1, 4) and queue.ptr == (ptr + 1) % 4


def test_storage_lives_on_the_requested_device():
    """Keys and ids are allocated where the caller asks (the shape-only "meta" device stands
    in for an accelerator on this CPU machine)."""
    queue = KeyQueue(4, DIM, device="meta")
    assert queue.device.type == "meta"
    assert queue.keys.device.type == "meta" and queue.ids.device.type == "meta"
