"""``moco_ref.core.lab.train_moco``: LAB 07's loop and return value on the reference trainer.

Every expectation is rebuilt here from what the encoders were observed to compute (a forward
hook on the model records each query and key, a wrapper around ``views`` records each
batch), never read back from ``train_moco``'s own result.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from moco_ref.core.lab import train_moco

DIM_IN, DIM_OUT = 6, 3


class TinyModel(nn.Module):
    """LAB 07's interface in miniature: ``.encoder`` and ``(features, projection)``."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.encoder = nn.Linear(DIM_IN, 5)
        self.head = nn.Linear(5, DIM_OUT)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator))
        self.double()

    def forward(self, x):
        features = torch.tanh(self.encoder(x))
        return features, self.head(features)


def noisy_views(seed: int):
    generator = torch.Generator().manual_seed(seed)

    def views(batch):
        noise = torch.randn(batch.shape, generator=generator, dtype=batch.dtype)
        return batch + 0.1 * noise

    return views


def make_items(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, DIM_IN, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


class Recorder:
    """Hooks ``initial`` (and so both of its deep copies) and wraps ``views``.

    Key-encoder calls are the ones made without autograd; query calls the ones with it.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, views) -> None:
        self.queries, self.keys, self.batches = [], [], []
        self._x, self._views, self._calls = x, views, 0
        queries, keys = self.queries, self.keys

        # A plain function: deepcopy shares it (a bound method would copy the recorder too).
        def hook(module, inputs, output):
            embedding = F.normalize(output[1], dim=1).detach().clone()
            (queries if torch.is_grad_enabled() else keys).append(embedding)

        model.register_forward_hook(hook)

    def views(self, batch):
        if self._calls % 2 == 0:  # the query view opens each batch
            matches = (batch[:, None, :] == self._x[None, :, :]).all(dim=2)  # [B, N]
            self.batches.append(matches.int().argmax(dim=1))
        self._calls += 1
        return self._views(batch)


def run(n_items=13, train=None, epochs=3, *, order="lab", capacity=7, batch_size=5,
        m=0.9, temperature=0.2, seed=0, model_seed=0):
    model = TinyModel(model_seed)
    x = make_items(n_items)
    train = list(range(1, n_items)) if train is None else train
    recorder = Recorder(model, x, noisy_views(seed + 100))
    result = train_moco(model, x, train, epochs, order=order, m=m, temperature=temperature,
                        capacity=capacity, batch_size=batch_size, lr=0.05, seed=seed,
                        views=recorder.views)
    return model, recorder, result


def test_key_parameters_never_receive_a_gradient():
    _, _, (query, key, *_rest) = run()
    assert all(param.grad is None for param in key.parameters())
    assert all(param.grad is not None for param in query.parameters())


def test_each_epoch_visits_every_training_item_once_in_ragged_batches():
    train = list(range(2, 15))  # 13 items, batches of 5: 5, 5, 3
    _, recorder, _ = run(n_items=16, train=train, epochs=2, batch_size=5)
    assert [len(ids) for ids in recorder.batches] == [5, 5, 3] * 2
    for epoch in range(2):
        seen = torch.cat(recorder.batches[3 * epoch : 3 * epoch + 3])
        assert sorted(seen.tolist()) == train


def test_queue_is_the_last_capacity_keys_in_arrival_order_with_their_ids():
    _, recorder, (_, _, queue, queue_ids, *_rest) = run(capacity=7, batch_size=5)
    arrived_keys = torch.cat(recorder.keys)  # [steps·B, d] in arrival order
    arrived_ids = torch.cat(recorder.batches)
    assert queue.dtype == torch.float64 and queue_ids.dtype == torch.int64
    assert torch.equal(queue, arrived_keys[-7:])
    assert torch.equal(queue_ids, arrived_ids[-7:])


def test_queue_larger_than_all_arrivals_keeps_them_all():
    _, recorder, (_, _, queue, queue_ids, *_rest) = run(epochs=1, capacity=100)
    assert torch.equal(queue, torch.cat(recorder.keys))
    assert torch.equal(queue_ids, torch.cat(recorder.batches))


def test_trace_reports_queue_fill_and_oldest_and_newest_ids_after_each_of_five_steps():
    _, recorder, (*_head, trace, _drift) = run(capacity=7, batch_size=5, epochs=3)
    arrived = torch.cat(recorder.batches).tolist()
    expected, seen = [], 0
    for step, ids in enumerate(recorder.batches[:5]):
        seen += len(ids)
        kept = arrived[:seen][-7:]
        expected.append({"step": step, "queue_size": len(kept), "first_source_id": kept[0],
                         "last_source_id": kept[-1]})
    assert trace == expected


def test_history_is_the_mean_infonce_loss_of_each_epoch():
    temperature, capacity = 0.2, 7
    _, recorder, (*_head, history, _trace, _drift) = run(
        capacity=capacity, temperature=temperature, epochs=3
    )
    losses, queue, queue_ids = [], torch.zeros(0, DIM_OUT, dtype=torch.float64), []
    for q, k, ids in zip(recorder.queries, recorder.keys, recorder.batches):
        if not queue_ids:  # first batch: the batch's own keys are the negatives
            log_p = torch.log_softmax(q @ k.T / temperature, dim=1).diagonal()
        else:
            negatives = q @ queue.T / temperature  # [B, n]
            same_source = ids[:, None] == torch.tensor(queue_ids)[None, :]
            negatives = negatives.masked_fill(same_source, -math.inf)
            logits = torch.cat([(q * k).sum(1, keepdim=True) / temperature, negatives], 1)
            log_p = torch.log_softmax(logits, dim=1)[:, 0]
        losses.append(-log_p.mean().item())
        queue = torch.cat([queue, k])[-capacity:]
        queue_ids = (queue_ids + ids.tolist())[-capacity:]
    per_epoch = [losses[i : i + 3] for i in range(0, len(losses), 3)]  # 12 items, batch 5
    assert all(isinstance(value, float) for value in history)
    assert history == pytest.approx([sum(e) / len(e) for e in per_epoch], rel=1e-12)


def test_drift_is_the_norm_of_the_change_of_the_first_encoder_parameter():
    model, _, (query, *_rest, drift) = run()
    untouched = TinyModel(0)
    assert torch.equal(model.encoder.weight, untouched.encoder.weight)  # initial not trained
    expected = (query.encoder.weight - untouched.encoder.weight).norm().item()
    assert isinstance(drift, float) and drift > 0
    assert drift == pytest.approx(expected, rel=1e-12)


def test_paper_and_lab_orders_are_bitwise_identical_but_for_the_trailing_ema():
    m = 0.9
    _, _, paper = run(order="paper", m=m, epochs=4)
    _, _, lab = run(order="lab", m=m, epochs=4)
    query_p, key_p, queue_p, ids_p, history_p, trace_p, drift_p = paper
    query_l, key_l, queue_l, ids_l, history_l, trace_l, drift_l = lab
    assert history_p == history_l
    assert torch.equal(queue_p, queue_l) and torch.equal(ids_p, ids_l)
    assert trace_p == trace_l and drift_p == drift_l
    for param_p, param_l in zip(query_p.parameters(), query_l.parameters()):
        assert torch.equal(param_p, param_l)
    for kp, kl, q in zip(key_p.parameters(), key_l.parameters(), query_l.parameters()):
        assert not torch.equal(kp, kl)
        assert torch.equal(kp, kl.lerp(q, 1 - m))  # the paper order's last EMA


def test_same_seed_same_run_whatever_the_global_rng():
    torch.manual_seed(1)
    _, _, first = run(seed=3)
    torch.manual_seed(2)
    _, _, second = run(seed=3)
    assert first[4] == second[4] and torch.equal(first[3], second[3])
    _, _, other = run(seed=4)
    assert other[4] != first[4]


def test_the_initial_model_is_copied_not_trained():
    model, _, (query, key, *_rest) = run()
    assert query is not model and key is not model and query is not key
    assert torch.equal(model.head.weight, TinyModel(0).head.weight)


GOOD = dict(x=make_items(8), train=[0, 1, 2, 3])


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"initial": "model"}, TypeError, "initial must be a torch.nn.Module"),
        ({"initial": nn.Linear(DIM_IN, 3)}, TypeError, "submodule `encoder`"),
        ({"x": [[0.0] * DIM_IN]}, TypeError, "x must be a torch.Tensor"),
        ({"x": torch.zeros(8, dtype=torch.int64)}, ValueError, "x must be a floating-point"),
        ({"train": []}, ValueError, "train must hold at least one index"),
        ({"train": [0, 8]}, ValueError, r"train must index x \(0 <= i < 8\), got \[8\]"),
        ({"train": [0, -1]}, ValueError, "train must index x"),
        ({"train": [1, 1, 2]}, ValueError, "train must not repeat an index"),
        ({"train": [0.0, 1.0]}, TypeError, "train must hold integer ids"),
        ({"epochs": 0}, ValueError, "epochs must be >= 1"),
        ({"epochs": 1.5}, TypeError, "epochs must be an int"),
        ({"order": "official"}, ValueError, "order must be one of"),
        ({"m": 1.5}, ValueError, r"m must lie in \[0, 1\]"),
        ({"temperature": 0.0}, ValueError, "temperature must be a finite number > 0"),
        ({"capacity": 0}, ValueError, "capacity must be >= 1"),
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"lr": -0.1}, ValueError, "lr must be a finite number > 0"),
        ({"seed": "0"}, TypeError, "seed must be an int"),
        ({"views": "flip"}, TypeError, "views must be callable"),
    ],
)
def test_bad_arguments_are_rejected_with_a_message_naming_them(change, error, message):
    arguments = {"initial": TinyModel(), **GOOD, "epochs": 1, "views": noisy_views(0), **change}
    initial, x, train, epochs = (arguments.pop(name) for name in ("initial", "x", "train",
                                                                   "epochs"))
    with pytest.raises(error, match=message):
        train_moco(initial, x, train, epochs, **arguments)
