"""Logits, the same-source mask and the loss (I4, I8)."""

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from moco_ref import contrastive_logits, in_batch_logits, info_nce_loss
from moco_ref.core.contrastive import positive_labels
from tests.helpers.strategies import seeds, temperatures, unit_rows


@st.composite
def logit_cases(draw):
    """q, k, a queue and ids where collisions range over none, some and all of a row."""
    batch, n, dim = draw(st.integers(1, 6)), draw(st.integers(0, 10)), draw(st.integers(1, 5))
    generator = torch.Generator().manual_seed(draw(seeds))
    q, k = unit_rows(generator, batch, dim), unit_rows(generator, batch, dim)
    queue = unit_rows(generator, n, dim)
    pool = draw(st.integers(1, 8))
    ids = torch.tensor(draw(st.lists(st.integers(0, pool - 1), min_size=batch, max_size=batch)))
    queue_ids = torch.tensor(draw(st.lists(st.integers(0, pool - 1), min_size=n, max_size=n)),
                             dtype=torch.int64)
    return q, k, queue, queue_ids, ids, draw(temperatures)


def _numpy_logits(q, k, queue, temperature):
    q, k, queue = q.numpy(), k.numpy(), queue.numpy()
    positive = np.einsum("bd,bd->b", q, k)[:, None]
    return np.concatenate([positive, q @ queue.T], axis=1) / temperature


@given(logit_cases())
@example((torch.eye(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64),
          torch.eye(2, dtype=torch.float64), torch.tensor([0, 0]), torch.tensor([0, 1]), 0.2))
def test_masked_entries_have_probability_zero_and_the_rest_equal_q_dot_key_over_t(case):
    """I4/I8: masked negatives get probability exactly 0; every unmasked logit is q·key/T;
    the positive is never masked."""
    q, k, queue, queue_ids, ids, temperature = case
    logits = contrastive_logits(q, k, queue, queue_ids, ids, temperature)
    expected = _numpy_logits(q, k, queue, temperature)
    collide = ids.numpy()[:, None] == queue_ids.numpy()[None, :]
    masked = np.concatenate([np.zeros((len(ids), 1), bool), collide], axis=1)
    got = logits.numpy()
    assert np.allclose(got[~masked], expected[~masked], rtol=1e-12, atol=1e-12)
    probabilities = logits.softmax(dim=1).numpy()
    assert (probabilities[masked] == 0.0).all()
    assert (probabilities[:, 0] > 0).all()
    # the loss is -ln p+ over the unmasked candidates only
    shifted = np.where(masked, -np.inf, expected)
    log_p_positive = shifted[:, 0] - np.log(np.exp(shifted).sum(axis=1))
    loss = info_nce_loss(logits)
    assert loss.item() == pytest.approx(-log_p_positive.mean(), rel=1e-10)


def test_loss_gradient_ignores_masked_negatives():
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    k = torch.tensor([[0.6, 0.8]], dtype=torch.float64)
    queue = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    info_nce_loss(contrastive_logits(q, k, queue, torch.tensor([5, 9]), torch.tensor([5]), 0.5))
    loss = info_nce_loss(contrastive_logits(q, k, queue, torch.tensor([5, 9]), torch.tensor([5]),
                                            0.5))
    loss.backward()
    reduced = q.detach().clone().requires_grad_(True)
    info_nce_loss(contrastive_logits(reduced, k, queue[1:], None, None, 0.5)).backward()
    assert torch.isfinite(q.grad).all()
    assert torch.allclose(q.grad, reduced.grad, rtol=1e-12, atol=0)


def test_empty_queue_gives_the_in_batch_form():
    generator = torch.Generator().manual_seed(3)
    q, k = unit_rows(generator, 4, 3), unit_rows(generator, 4, 3)
    logits, labels = in_batch_logits(q, k, 0.2)
    assert np.allclose(logits.numpy(), q.numpy() @ k.numpy().T / 0.2, rtol=1e-12)
    assert labels.tolist() == [0, 1, 2, 3]
    masked, _ = in_batch_logits(q, k, 0.2, ids=torch.tensor([7, 8, 7, 9]))
    probabilities = masked.softmax(dim=1)
    assert probabilities[0, 2] == 0 and probabilities[2, 0] == 0
    assert (probabilities.diagonal() > 0).all()


def test_positive_is_column_zero_and_loss_defaults_to_label_zero():
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    logits = contrastive_logits(q, q, torch.tensor([[0.0, 1.0]], dtype=torch.float64),
                                None, None, 1.0)
    assert logits.tolist() == [[1.0, 0.0]]
    assert info_nce_loss(logits).item() == pytest.approx(np.log(1 + np.exp(-1.0)), rel=1e-12)


@pytest.mark.parametrize(
    ("change", "error", "needle"),
    [
        ({"temperature": 0.0}, ValueError, "temperature"),
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"k": torch.zeros(3, 2)}, ValueError, "same shape"),
        ({"queue_keys": torch.zeros(2, 3)}, ValueError, "2 columns"),
        ({"ids": None}, ValueError, "both"),
        ({"ids": torch.tensor([1, 2, 3])}, ValueError, "one id per key"),
        ({"queue_ids": torch.tensor([1.0, 2.0])}, TypeError, "integer"),
        ({"q": torch.tensor([[float("nan"), 0.0], [0.0, 1.0]])}, ValueError, "finite"),
        ({"queue_keys": torch.tensor([[0.0, 1.0], [float("inf"), 0.0]])}, ValueError,
         r"queue_keys must be finite; rows \[1\]"),
    ],
)
def test_logits_reject_bad_input(change, error, needle):
    arguments = {
        "q": torch.eye(2), "k": torch.eye(2), "queue_keys": torch.eye(2),
        "queue_ids": torch.tensor([0, 1]), "ids": torch.tensor([0, 1]), "temperature": 0.2,
    }
    arguments.update(change)
    with pytest.raises(error, match=needle):
        contrastive_logits(**arguments)


def test_a_checked_queue_is_not_scanned_again():
    """``queue_checked=True`` (a module's own buffer, checked entry by entry on arrival) skips
    the finiteness scan of the queue, and only that one: q and k are still checked."""
    queue = torch.tensor([[0.0, 1.0], [float("nan"), 0.0]])
    logits = contrastive_logits(torch.eye(2), torch.eye(2), queue, None, None, 0.5,
                                queue_checked=True)
    assert torch.isnan(logits[:, 2]).all() and torch.isfinite(logits[:, :2]).all()
    with pytest.raises(ValueError, match="q must be finite"):
        contrastive_logits(torch.tensor([[float("nan"), 0.0]]), torch.eye(2)[:1], queue[:1],
                           None, None, 0.5, queue_checked=True)


def test_loss_rejects_nan_logits():
    with pytest.raises(ValueError, match="NaN"):
        info_nce_loss(torch.tensor([[float("nan"), 0.0]]))


@given(st.lists(st.integers(0, 6), max_size=8), st.lists(st.integers(0, 6), max_size=30))
def test_same_source_pairs_are_exactly_the_equal_ids(ids, queue_ids):
    """The pairs the mask uses are every (i, j) with ids[i] == queue_ids[j], found by a
    plain double loop here."""
    from moco_ref import same_source_pairs

    rows, cols = same_source_pairs(torch.tensor(ids, dtype=torch.long),
                                   torch.tensor(queue_ids, dtype=torch.long))
    expected = sorted((i, j) for i, a in enumerate(ids) for j, b in enumerate(queue_ids) if a == b)
    assert sorted(zip(rows.tolist(), cols.tolist())) == expected


def test_positive_labels_live_on_the_requested_device():
    """Labels are created on the logits' device (the "meta" device stands in for an
    accelerator on this CPU machine)."""
    labels = positive_labels(3, torch.device("meta"))
    assert labels.device.type == "meta" and labels.dtype == torch.int64 and labels.shape == (3,)
