"""moco_ref.MoCo: a drop-in for the official-style module, with masking and ragged K."""

import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

from moco_ref import MoCo
from tests.helpers.tiny_encoders import TinyConvNet

ROOT = Path(__file__).resolve().parents[2]


def _official_style():
    spec = importlib.util.spec_from_file_location(
        "official_style", ROOT / "examples" / "builder" / "official_style.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MoCo


def _pair(seed=0, **kwargs):
    torch.manual_seed(seed)
    ours = MoCo(TinyConvNet, **kwargs)
    torch.manual_seed(seed)
    theirs = _official_style()(TinyConvNet, **kwargs)
    return ours, theirs


@pytest.mark.parametrize("mlp", [False, True])
def test_equivalent_to_the_official_style_module_over_several_steps(mlp):
    """Same init and inputs: same logits, labels, queue, pointer and parameters (float32;
    the official mul_/add_ EMA differs from lerp by rounding, hence rtol 1e-5)."""
    ours, theirs = _pair(dim=16, K=32, m=0.9, T=0.07, mlp=mlp)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    for step in range(6):
        im_q, im_k = torch.randn(2, 8, 3, 8, 8, generator=generator)
        logits_a, labels_a = ours(im_q, im_k)
        logits_b, labels_b = theirs(im_q, im_k)
        assert torch.equal(labels_a, labels_b)
        torch.testing.assert_close(logits_a, logits_b, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        for optimizer, logits, labels in ((opt_ours, logits_a, labels_a),
                                          (opt_theirs, logits_b, labels_b)):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(logits, labels).backward()
            optimizer.step()
        torch.testing.assert_close(ours.queue, theirs.queue, rtol=1e-5, atol=1e-6)
        assert torch.equal(ours.queue_ptr, theirs.queue_ptr)
        mine = ours.state_dict()
        for name, value in theirs.state_dict().items():
            torch.testing.assert_close(mine[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_key_encoder_never_receives_gradients():
    model = MoCo(TinyConvNet, dim=16, K=20)
    logits, labels = model(torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8))
    torch.nn.functional.cross_entropy(logits, labels).backward()
    assert all(p.grad is None for p in model.encoder_k.parameters())
    assert all(p.grad is not None for p in model.encoder_q.parameters())


def test_queue_wraps_when_k_is_not_a_multiple_of_the_batch():
    """FIFO over the [dim, K] buffer: reading from queue_ptr gives the last K keys."""
    model = MoCo(TinyConvNet, dim=16, K=10, shuffle_bn=False)
    arrived = []
    generator = torch.Generator().manual_seed(2)
    for step in range(5):
        images = torch.randn(4, 3, 8, 8, generator=generator)
        model(images, images, ids=torch.arange(4 * step, 4 * step + 4))
        with torch.no_grad():
            k = torch.nn.functional.normalize(model.encoder_k(images), dim=1)  # same θk
        arrived += list(zip(k, range(4 * step, 4 * step + 4)))
    ptr = int(model.queue_ptr)
    in_order = torch.cat([model.queue[:, ptr:], model.queue[:, :ptr]], dim=1).T
    ids = torch.cat([model.queue_ids[ptr:], model.queue_ids[:ptr]])
    assert ids.tolist() == [i for _, i in arrived[-10:]]
    torch.testing.assert_close(in_order, torch.stack([k for k, _ in arrived[-10:]]))
    assert ptr == 20 % 10


def test_ids_mask_same_source_negatives():
    model = MoCo(TinyConvNet, dim=16, K=8)
    images = torch.randn(4, 3, 8, 8)
    model(images, images, ids=torch.tensor([0, 1, 2, 3]))
    logits, _ = model(images, images, ids=torch.tensor([3, 4, 5, 6]))
    stored = model.queue_ids.tolist()  # after the second enqueue; the first batch sits at 0..3
    assert stored[:4] == [0, 1, 2, 3]
    assert logits[0, 1 + 3] == float("-inf")  # query id 3 meets the queue entry of id 3
    assert torch.isfinite(logits[1:, 1:]).all() and torch.isfinite(logits[:, 0]).all()


def test_paper_order_leaves_the_ema_to_the_caller():
    model = MoCo(TinyConvNet, dim=16, K=8, order="paper", m=0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = [p.clone() for p in model.encoder_k.parameters()]
    logits, labels = model(torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8))
    torch.nn.functional.cross_entropy(logits, labels).backward()
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.encoder_k.parameters()))
    model.update_key_encoder()
    for old, new, q in zip(before, model.encoder_k.parameters(), model.encoder_q.parameters()):
        torch.testing.assert_close(new, 0.5 * old + 0.5 * q)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"K": 0}, ValueError), ({"m": 2.0}, ValueError), ({"T": 0.0}, ValueError),
     ({"dim": 0}, ValueError), ({"order": "official"}, ValueError)],
)
def test_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        MoCo(TinyConvNet, **kwargs)


def test_lab_order_refuses_a_second_ema():
    with pytest.raises(RuntimeError, match="inside forward"):
        MoCo(TinyConvNet, dim=4, K=4).update_key_encoder()


def test_defaults_match_the_official_module():
    """Drop-in: built with only a base encoder, the module has the official defaults (dim,
    K, m, T, no MLP head); the extras default to the official behaviour (EMA inside
    forward, shuffled BN)."""
    ours, theirs = MoCo(TinyConvNet), _official_style()(TinyConvNet)
    assert (ours.K, ours.m, ours.T) == (theirs.K, theirs.m, theirs.T)
    assert ours.queue.shape == theirs.queue.shape
    assert {name: tuple(value.shape) for name, value in theirs.state_dict().items()}.items() <= {
        name: tuple(value.shape) for name, value in ours.state_dict().items()}.items()
    assert ours.order == "lab" and ours.shuffle_bn is True
    signature = inspect.signature(MoCo).parameters
    assert list(signature)[:6] == list(inspect.signature(_official_style()).parameters)


def test_key_encoder_parameters_do_not_require_grad():
    """I1 by construction, as in the official module: θk starts as a copy of θq and is
    excluded from autograd."""
    model = MoCo(TinyConvNet, dim=8, K=16)
    assert not any(p.requires_grad for p in model.encoder_k.parameters())
    assert all(torch.equal(k, q) for k, q in
               zip(model.encoder_k.parameters(), model.encoder_q.parameters()))


def test_keys_come_back_in_batch_order_after_the_shuffle(monkeypatch):
    """Shuffle-BN: whatever order the key encoder sees the batch in, key i is the key of
    image i (a reversing shuffle stands in for the cross-rank permutation)."""
    def reverse(x):
        return x.flip(0), torch.arange(len(x) - 1, -1, -1)

    monkeypatch.setattr("moco_ref.core.builder.shuffle_batch", reverse)
    torch.manual_seed(0)
    model = MoCo(TinyConvNet, dim=8, K=16, m=1.0)  # m = 1: θk stays put during forward
    images = torch.randn(4, 3, 8, 8)
    model(torch.randn(4, 3, 8, 8), images)
    with torch.no_grad():
        expected = torch.nn.functional.normalize(model.encoder_k(images), dim=1)
    torch.testing.assert_close(model.queue.T[:4], expected, rtol=1e-5, atol=1e-6)


def test_checkpoints_load_both_ways_strictly():
    """An official checkpoint (no queue_ids) loads strictly into moco_ref.MoCo, its queued
    keys marked as from no known image; official_state_dict() loads strictly into the
    official module; our own checkpoints keep their ids."""
    ours, theirs = _pair(seed=3, dim=8, K=12)
    for _ in range(2):  # move the queue and the pointer away from their initial values
        theirs(*torch.randn(2, 4, 3, 8, 8))
    ours.queue_ids.fill_(7)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert torch.equal(ours.queue, theirs.queue) and torch.equal(ours.queue_ptr, theirs.queue_ptr)
    assert torch.equal(ours.queue_ids, torch.full((12,), -1))
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name

    ours(*torch.randn(2, 4, 3, 8, 8), ids=torch.arange(4))
    fresh = _official_style()(TinyConvNet, dim=8, K=12)
    fresh.load_state_dict(ours.official_state_dict(), strict=True)
    assert torch.equal(fresh.queue, ours.queue)

    again = MoCo(TinyConvNet, dim=8, K=12)
    again.load_state_dict(ours.state_dict(), strict=True)
    assert torch.equal(again.queue_ids, ours.queue_ids)
    assert set(again.queue_ids.tolist()) >= {0, 1, 2, 3}


def test_a_checkpoint_with_a_non_finite_queue_is_refused_on_load():
    """The forward does not scan its own queue (every entry is checked when it arrives), so a
    loaded queue is checked as it arrives, with or without queue_ids."""
    model = MoCo(TinyConvNet, dim=8, K=12)
    for with_ids in (True, False):
        state = model.state_dict() if with_ids else model.official_state_dict()
        state["queue"] = state["queue"].clone()
        state["queue"][3, 5] = float("nan")
        with pytest.raises(ValueError, match="the checkpoint's queue must be finite; rows \\[3\\]"):
            model.load_state_dict(state)
    model.load_state_dict(model.state_dict())  # a finite one loads
