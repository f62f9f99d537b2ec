"""MoCoTrainer: key grads (I1), untouched old keys (I2), FIFO through steps (I3), the loss
(I8), current keys not negatives (I9), and the two orders (I6)."""

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from moco_ref import MoCoTrainer, momentum_update
from moco_ref.core.step import projection_of
from tests.helpers.strategies import id_batches, momenta, seeds, temperatures, tiny_models

IN_DIM = 5


def _views(batches, seed):
    """Two fixed views per batch: the image of each id plus a little noise."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(12, IN_DIM, generator=generator, dtype=torch.float64)
    out = []
    for ids in batches:
        ids = torch.tensor(ids)
        noise = 0.1 * torch.randn(2, len(ids), IN_DIM, generator=generator, dtype=torch.float64)
        out.append((images[ids] + noise[0], images[ids] + noise[1], ids))
    return out


def _trainer(model, order, m, temperature, capacity, optimizer="adam"):
    make = {"adam": lambda p: torch.optim.Adam(p, lr=0.05),
            "sgd": lambda p: torch.optim.SGD(p, lr=0.3, momentum=0.9)}[optimizer]
    return MoCoTrainer(model, make(model.parameters()), m=m, temperature=temperature,
                       capacity=capacity, order=order)


def _numpy_loss(q, k, queue_keys, queue_ids, ids, temperature):
    """−ln p⁺ recomputed in numpy from the recorded tensors."""
    q, k = q.numpy(), k.numpy()
    if len(queue_keys) == 0:
        logits = q @ k.T / temperature
        positive = np.arange(len(q))
    else:
        negatives = q @ queue_keys.numpy().T
        negatives[ids.numpy()[:, None] == queue_ids.numpy()[None, :]] = -np.inf
        logits = np.concatenate([np.einsum("bd,bd->b", q, k)[:, None], negatives], 1)
        logits /= temperature
        positive = np.zeros(len(q), dtype=int)
    top = logits.max(axis=1, keepdims=True)
    log_p = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    return -log_p[np.arange(len(q)), positive].mean()


@given(model=tiny_models(), batches=id_batches(), m=momenta, temperature=temperatures,
       capacity=st.integers(1, 16), seed=seeds, order=st.sampled_from(["paper", "lab"]))
def test_step_invariants(model, batches, m, temperature, capacity, seed, order):
    """I1, I2, I3, I8, I9 observed on the reference step by step."""
    trainer = _trainer(model, order, m, temperature, capacity)
    grad_enabled_in_key_forward = []
    trainer.encoder_k.register_forward_hook(
        lambda *_: grad_enabled_in_key_forward.append(torch.is_grad_enabled())
    )
    arrived = []
    for step, (view_q, view_k, ids) in enumerate(_views(batches, seed)):
        queue_keys = trainer.queue.keys if trainer.queue else torch.zeros(0, 4, dtype=torch.float64)
        queue_ids = trainer.queue.ids if trainer.queue else torch.zeros(0, dtype=torch.int64)
        key_params_before = [p.clone() for p in trainer.encoder_k.parameters()]
        result = trainer.step(view_q, view_k, ids)
        note(f"step {step}: ids {ids.tolist()} queue before {queue_ids.tolist()}")
        # I1: no key gradient, no autograd in the key forward
        assert all(p.grad is None for p in trainer.encoder_k.parameters())
        assert grad_enabled_in_key_forward[-1] is False and result.k.grad_fn is None
        # I8 + I9: the loss is −ln p⁺ over the queue as it was before the step
        assert result.in_batch == (len(queue_ids) == 0)
        expected = _numpy_loss(result.q, result.k, queue_keys, queue_ids, ids, temperature)
        assert result.loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
        if not result.in_batch:
            assert result.logits.shape == (len(ids), 1 + len(queue_ids))
        # I3: the queue is the last `capacity` keys in arrival order, ids with them
        arrived += list(zip(result.k, ids.tolist()))
        expected_queue = arrived[-capacity:]
        assert trainer.queue.ids.tolist() == [i for _, i in expected_queue]
        # I2: every entry is bitwise the key produced at its own step
        assert all(torch.equal(a, b) for a, (b, _) in zip(trainer.queue.keys, expected_queue))
        key_moved = any(not torch.equal(a, b)
                        for a, b in zip(key_params_before, trainer.encoder_k.parameters()))
        note(f"key encoder moved: {key_moved}")


def _trajectory(model, batches, seed, order, m, temperature, capacity, optimizer):
    trainer = _trainer(copy.deepcopy(model), order, m, temperature, capacity, optimizer)
    steps = []
    for view_q, view_k, ids in _views(batches, seed):
        result = trainer.step(view_q, view_k, ids)
        steps.append({
            "k": result.k, "loss": result.loss, "queue": trainer.queue.keys,
            "queue_ids": trainer.queue.ids,
            "query": [p.detach().clone() for p in trainer.encoder_q.parameters()],
        })
    return trainer, steps


@given(model=tiny_models(), batches=id_batches(), m=momenta, temperature=temperatures,
       capacity=st.integers(1, 16), seed=seeds, optimizer=st.sampled_from(["adam", "sgd"]))
def test_paper_and_lab_orders_are_bitwise_identical(
    model, batches, m, temperature, capacity, seed, optimizer
):
    """I6: from θk = θq, both orders give the same keys, losses, queue and query params at
    every step; the paper order's key encoder is one trailing EMA ahead at the end."""
    arguments = (batches, seed)
    settings = (m, temperature, capacity, optimizer)
    paper, paper_steps = _trajectory(model, *arguments, "paper", *settings)
    lab, lab_steps = _trajectory(model, *arguments, "lab", *settings)
    for step, (a, b) in enumerate(zip(paper_steps, lab_steps)):
        for name in ("k", "loss", "queue", "queue_ids"):
            assert torch.equal(a[name], b[name]), f"{name} differs at step {step}"
        assert all(torch.equal(x, y) for x, y in zip(a["query"], b["query"])), step
    momentum_update(lab.encoder_k, lab.encoder_q, m)  # the paper order's trailing EMA
    assert all(torch.equal(x, y)
               for x, y in zip(paper.encoder_k.parameters(), lab.encoder_k.parameters()))


def test_key_encoder_follows_the_query_encoder_by_ema_each_step():
    """I7 through the trainer: after each paper step θk = m·θk_before + (1−m)·θq_after."""
    torch.manual_seed(0)
    model = torch.nn.Linear(IN_DIM, 4).double()
    trainer = _trainer(model, "paper", 0.8, 0.2, 6)
    for view_q, view_k, ids in _views([[0, 1, 2], [3, 4], [5, 6, 7]], 1):
        before = [p.clone() for p in trainer.encoder_k.parameters()]
        trainer.step(view_q, view_k, ids)
        for old, new, query in zip(before, trainer.encoder_k.parameters(),
                                   trainer.encoder_q.parameters()):
            assert torch.allclose(new, 0.8 * old + 0.2 * query, rtol=1e-12, atol=1e-14)
            assert not torch.equal(new, old)


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"order": "official"}, ValueError, "order"),
        ({"m": 1.2}, ValueError, "m must"),
        ({"temperature": 0}, ValueError, "temperature"),
        ({"capacity": 0}, ValueError, "capacity"),
        ({"optimizer": "adam"}, TypeError, "optimizer"),
        ({"key_encoder": torch.nn.Linear(3, 4)}, ValueError, "matching parameters"),
    ],
)
def test_trainer_rejects_bad_arguments(kwargs, error, needle):
    model = torch.nn.Linear(IN_DIM, 4)
    arguments = {"optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "m": 0.9,
                 "temperature": 0.2, "capacity": 4}
    arguments.update(kwargs)
    with pytest.raises(error, match=needle):
        MoCoTrainer(model, **arguments)


def test_step_rejects_mismatched_batch():
    model = torch.nn.Linear(IN_DIM, 4)
    trainer = _trainer(model, "lab", 0.9, 0.2, 4, "sgd")
    with pytest.raises(ValueError, match="one id per key"):
        trainer.step(torch.zeros(3, IN_DIM), torch.zeros(3, IN_DIM), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="same batch"):
        trainer.step(torch.zeros(3, IN_DIM), torch.zeros(2, IN_DIM), torch.tensor([0, 1, 2]))


def test_projection_is_the_last_element_of_a_tuple():
    """LAB 07 models return (features, projection); longer tuples end with the embedding."""
    first, middle, last = torch.zeros(2, 3), torch.ones(2, 3), torch.full((2, 3), 2.0)
    assert projection_of((first, middle, last)) is last
    assert projection_of([first, last]) is last
    assert projection_of(last) is last


def test_step_result_reports_labels_ids_and_form():
    """The first step (empty queue) is in-batch: labels arange(B); later ones put the
    positive at column 0: labels zeros(B). The ids are the batch's own, as int64."""
    model = torch.nn.Linear(IN_DIM, 4).double()
    trainer = _trainer(model, "lab", 0.9, 0.2, 8, "sgd")
    views = _views([[3, 5, 7], [1, 2]], 0)
    first = trainer.step(*views[0])
    assert first.in_batch and first.labels.tolist() == [0, 1, 2]
    assert first.ids.tolist() == [3, 5, 7] and first.ids.dtype == torch.int64
    second = trainer.step(views[1][0], views[1][1], [1, 2])
    assert not second.in_batch and second.labels.tolist() == [0, 0]
    assert second.ids.tolist() == [1, 2] and second.logits.shape == (2, 1 + 3)


def test_in_batch_step_masks_keys_of_the_same_image():
    """With an empty queue, another key of the batch from the query's own image is not a
    negative: its logit is −inf (I4 in the warm-up form)."""
    model = torch.nn.Linear(IN_DIM, 4).double()
    trainer = _trainer(model, "lab", 0.9, 0.2, 8, "sgd")
    view_q, view_k, _ = _views([[0, 0, 1]], 0)[0]
    logits = trainer.step(view_q, view_k, torch.tensor([4, 4, 9])).logits
    assert logits[0, 1] == float("-inf") and logits[1, 0] == float("-inf")
    off_diagonal_other = [logits[0, 2], logits[1, 2], logits[2, 0], logits[2, 1]]
    assert all(torch.isfinite(value) for value in off_diagonal_other)
    assert torch.isfinite(logits.diagonal()).all()


def test_key_encoder_parameters_do_not_require_grad():
    """I1 by construction: the trainer switches gradients off for every key parameter."""
    model = torch.nn.Linear(IN_DIM, 4)
    trainer = _trainer(model, "lab", 0.9, 0.2, 8)
    assert not any(p.requires_grad for p in trainer.encoder_k.parameters())
    assert all(p.requires_grad for p in trainer.encoder_q.parameters())


class _SitsOutAfterFirstCall(torch.nn.Module):
    """A linear map plus a bias that takes part in the first forward only."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(IN_DIM, 4).double()
        self.extra = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x) + (self.extra if self.calls == 1 else 0.0)


def test_a_parameter_that_sits_out_a_step_is_left_alone():
    """Gradients are cleared as `optimizer.zero_grad()` does (set to None), so Adam does not
    move a parameter that took no part in this step's loss."""
    model = _SitsOutAfterFirstCall()
    trainer = MoCoTrainer(model, torch.optim.Adam(model.parameters(), lr=0.05), m=0.9,
                          temperature=0.2, capacity=8, key_encoder=copy.deepcopy(model))
    views = _views([[0, 1], [2, 3]], 0)
    trainer.step(*views[0])
    after_first = model.extra.detach().clone()
    trainer.step(*views[1])
    assert torch.equal(model.extra.detach(), after_first)


@pytest.mark.parametrize("order", ["paper", "lab"])
def test_a_rejected_step_leaves_the_trainer_untouched(order):
    """Ids of the wrong length are refused before anything moves: no EMA, no query update,
    no enqueue."""
    model = torch.nn.Linear(IN_DIM, 4).double()
    trainer = _trainer(model, order, 0.5, 0.2, 8, "sgd")
    view_q, view_k, ids = _views([[0, 1, 2]], 0)[0]
    trainer.step(view_q, view_k, ids)  # θk and θq now differ
    before = [p.clone() for p in [*trainer.encoder_q.parameters(), *trainer.encoder_k.parameters()]]
    queue_before = trainer.queue.ids.tolist()
    with pytest.raises(ValueError, match="one id per key"):
        trainer.step(view_q, view_k, ids[:2])
    after = [*trainer.encoder_q.parameters(), *trainer.encoder_k.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert trainer.queue.ids.tolist() == queue_before
