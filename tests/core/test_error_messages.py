"""Bad input to the reference core fails early with one exact, readable message.

The message is the contract here: it names the argument, what was expected and what came
in, so a user never needs a debugger. Each case is an id usable with ``-k``.
"""

import pytest
import torch
from torch import nn

from moco_ref import KeyQueue, MoCo, MoCoTrainer, momentum_update
from moco_ref.core.contrastive import contrastive_logits, in_batch_logits, info_nce_loss
from moco_ref.core.step import projection_of
from tests.helpers.tiny_encoders import TinyConvNet

IN_DIM = 5


def _trainer(**overrides):
    model = nn.Linear(IN_DIM, 4)
    arguments = {"optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "m": 0.9,
                 "temperature": 0.2, "capacity": 4}
    arguments.update(overrides)
    return MoCoTrainer(model, **arguments)


def _storage(rows=4, dim=3):
    return torch.zeros(rows, dim), torch.full((rows,), -1, dtype=torch.int64)


def _moco(**overrides):
    return MoCo(TinyConvNet, **{"dim": 4, "K": 8, **overrides})


ROWS, BAD_DIM = torch.zeros(2, 3), torch.zeros(2, 4)

CASES = {
    # KeyQueue
    "queue-capacity": (lambda: KeyQueue(0, 3), ValueError, "capacity must be >= 1, got 0"),
    "queue-dim": (lambda: KeyQueue(4, 2.0), TypeError, "dim must be an int, got float"),
    "queue-integer-dtype": (
        lambda: KeyQueue(4, 3, dtype=torch.int64),
        TypeError, "dtype must be a floating-point torch.dtype, got torch.int64"),
    "enqueue-key-columns": (
        lambda: KeyQueue(4, 3).enqueue(BAD_DIM, [0, 1]),
        ValueError, "keys must have 3 columns (the feature dimension), got shape [2, 4]"),
    "enqueue-ids-length": (
        lambda: KeyQueue(4, 3).enqueue(ROWS, [0]),
        ValueError, "ids must have one id per key: expected 2 ids, got 1"),
    "enqueue-dtype": (
        lambda: KeyQueue(4, 3).enqueue(ROWS.double(), [0, 1]),
        TypeError, "keys must have the queue's dtype torch.float32, got torch.float64"),
    # KeyQueue.over_storage: the ring storage an official-style module hands over
    "over_storage-integer-keys": (
        lambda: KeyQueue.over_storage(torch.zeros(4, 3, dtype=torch.int64), _storage()[1], 0, 0),
        ValueError,
        "keys storage must be a floating [capacity, dim] tensor, got torch.int64 [4, 3]"),
    "over_storage-flat-keys": (
        lambda: KeyQueue.over_storage(torch.zeros(4), _storage()[1], 0, 0),
        ValueError,
        "keys storage must be a floating [capacity, dim] tensor, got torch.float32 [4]"),
    "over_storage-short-ids": (
        lambda: KeyQueue.over_storage(torch.zeros(4, 3), torch.zeros(3, dtype=torch.int64), 0, 0),
        ValueError, "ids storage must be int64 [4], got torch.int64 [3]"),
    "over_storage-int32-ids": (
        lambda: KeyQueue.over_storage(torch.zeros(4, 3), torch.zeros(4, dtype=torch.int32), 0, 0),
        ValueError, "ids storage must be int64 [4], got torch.int32 [4]"),
    "over_storage-ptr-at-capacity": (
        lambda: KeyQueue.over_storage(*_storage(), 4, 0),
        ValueError, "ptr 4 and size 0 must fit capacity 4"),
    "over_storage-ptr-negative": (
        lambda: KeyQueue.over_storage(*_storage(), -1, 2),
        ValueError, "ptr -1 and size 2 must fit capacity 4"),
    "over_storage-size-above-capacity": (
        lambda: KeyQueue.over_storage(*_storage(), 0, 5),
        ValueError, "ptr 0 and size 5 must fit capacity 4"),
    "over_storage-gap-before-ptr": (
        lambda: KeyQueue.over_storage(*_storage(), 3, 2),
        ValueError, "a queue that is not full fills slots 0..size-1, so ptr must equal size 2, "
                    "got ptr 3"),
    # the EMA
    "ema-key-not-a-module": (
        lambda: momentum_update("encoder", nn.Linear(3, 4), 0.9),
        TypeError, "key_model must be a torch.nn.Module, got str"),
    "ema-query-not-a-module": (
        lambda: momentum_update(nn.Linear(3, 4), 7, 0.9),
        TypeError, "query_model must be a torch.nn.Module, got int"),
    "ema-parameter-count": (
        lambda: momentum_update(nn.Linear(3, 4, bias=False), nn.Linear(3, 4), 0.9),
        ValueError, "key_model and query_model must have matching parameters: key_model has 1, "
                    "query_model has 2"),
    "ema-parameter-shape": (
        lambda: momentum_update(nn.Linear(5, 4), nn.Linear(3, 4), 0.9),
        ValueError, "key_model and query_model must have matching parameters: key 'weight' is "
                    "[4, 5] torch.float32, query 'weight' is [4, 3] torch.float32"),
    "ema-momentum": (
        lambda: momentum_update(nn.Linear(3, 4), nn.Linear(3, 4), -0.1),
        ValueError, "m must lie in [0, 1], got -0.1"),
    # the trainer
    "trainer-order": (
        lambda: _trainer(order="official"),
        ValueError, "order must be one of ('paper', 'lab'), got 'official'"),
    "trainer-optimizer": (
        lambda: _trainer(optimizer="adam"),
        TypeError, "optimizer must be a torch.optim.Optimizer, got 'adam'"),
    "trainer-momentum": (
        lambda: _trainer(m=1.5), ValueError, "m must lie in [0, 1], got 1.5"),
    "trainer-temperature": (
        lambda: _trainer(temperature=0),
        ValueError, "temperature must be a finite number > 0, got 0.0"),
    "trainer-capacity": (
        lambda: _trainer(capacity=0), ValueError, "capacity must be >= 1, got 0"),
    "step-ids-length": (
        lambda: _trainer().step(torch.zeros(3, IN_DIM), torch.zeros(3, IN_DIM), [0, 1]),
        ValueError, "ids must have one id per key: expected 3 ids, got 2"),
    "step-view-lengths": (
        lambda: _trainer().step(torch.zeros(3, IN_DIM), torch.zeros(2, IN_DIM), [0, 1, 2]),
        ValueError, "view_q and view_k must hold the same batch, got 3 and 2 items"),
    "projection-of-a-dict": (
        lambda: projection_of({"z": ROWS}),
        TypeError, "the encoder must return a [B, d] tensor or a tuple ending with one, got dict"),
    "projection-of-a-3d-tensor": (
        lambda: projection_of(torch.zeros(2, 3, 1)),
        TypeError, "the encoder must return a [B, d] tensor or a tuple ending with one, "
                   "got Tensor"),
    # logits and loss
    "logits-temperature": (
        lambda: contrastive_logits(ROWS, ROWS, ROWS, None, None, -1.0),
        ValueError, "temperature must be a finite number > 0, got -1.0"),
    "logits-query-type": (
        lambda: contrastive_logits(ROWS.tolist(), ROWS, ROWS, None, None, 0.1),
        TypeError, "q must be a torch.Tensor, got list"),
    "logits-key-columns": (
        lambda: contrastive_logits(ROWS, BAD_DIM, ROWS, None, None, 0.1),
        ValueError, "k must have 3 columns (the feature dimension), got shape [2, 4]"),
    "logits-queue-columns": (
        lambda: contrastive_logits(ROWS, ROWS, BAD_DIM, None, None, 0.1),
        ValueError, "queue_keys must have 3 columns (the feature dimension), got shape [2, 4]"),
    "logits-rows": (
        lambda: contrastive_logits(ROWS, torch.zeros(3, 3), ROWS, None, None, 0.1),
        ValueError, "q and k must have the same shape, got [2, 3] and [3, 3]"),
    "logits-half-masking": (
        lambda: contrastive_logits(ROWS, ROWS, ROWS, None, [0, 1], 0.1),
        ValueError, "ids and queue_ids must both be given (masking) or both be None"),
    "logits-queue-ids-length": (
        lambda: contrastive_logits(ROWS, ROWS, ROWS, [0], [0, 1], 0.1),
        ValueError, "queue_ids must have one id per key: expected 2 ids, got 1"),
    "logits-ids-length": (
        lambda: contrastive_logits(ROWS, ROWS, ROWS, [0, 1], [0], 0.1),
        ValueError, "ids must have one id per key: expected 2 ids, got 1"),
    "in-batch-temperature": (
        lambda: in_batch_logits(ROWS, ROWS, 0.0),
        ValueError, "temperature must be a finite number > 0, got 0.0"),
    "in-batch-query-type": (
        lambda: in_batch_logits([[0.0]], ROWS, 0.1),
        TypeError, "q must be a torch.Tensor, got list"),
    "in-batch-key-columns": (
        lambda: in_batch_logits(ROWS, BAD_DIM, 0.1),
        ValueError, "k must have 3 columns (the feature dimension), got shape [2, 4]"),
    "in-batch-rows": (
        lambda: in_batch_logits(ROWS, torch.zeros(3, 3), 0.1),
        ValueError, "q and k must have the same shape, got [2, 3] and [3, 3]"),
    "in-batch-ids-length": (
        lambda: in_batch_logits(ROWS, ROWS, 0.1, [0, 1, 2]),
        ValueError, "ids must have one id per key: expected 2 ids, got 3"),
    "loss-not-a-tensor": (
        lambda: info_nce_loss([[0.0, 1.0]]), TypeError, "logits must be a torch.Tensor, got list"),
    "loss-integer-logits": (
        lambda: info_nce_loss(torch.zeros(2, 3, dtype=torch.int64)),
        ValueError, "logits must be a floating-point [B, C] tensor, got torch.int64 [2, 3]"),
    "loss-flat-logits": (
        lambda: info_nce_loss(torch.zeros(3)),
        ValueError, "logits must be a floating-point [B, C] tensor, got torch.float32 [3]"),
    "loss-positive-infinity": (
        lambda: info_nce_loss(torch.tensor([[float("inf"), 0.0]])),
        ValueError, "logits must not contain NaN or +inf (−inf marks a masked entry)"),
    "loss-labels-length": (
        lambda: info_nce_loss(torch.zeros(2, 3), torch.zeros(3, dtype=torch.int64)),
        ValueError, "labels must have one id per key: expected 2 ids, got 3"),
    # the official-compatible module
    "moco-order": (
        lambda: _moco(order="official"),
        ValueError, "order must be one of ('paper', 'lab'), got 'official'"),
    "moco-dim": (lambda: _moco(dim=0), ValueError, "dim must be >= 1, got 0"),
    "moco-K": (lambda: _moco(K=0), ValueError, "K must be >= 1, got 0"),
    "moco-m": (lambda: _moco(m=2.0), ValueError, "m must lie in [0, 1], got 2.0"),
    "moco-T": (lambda: _moco(T=0.0), ValueError, "T must be a finite number > 0, got 0.0"),
    "moco-mlp-without-fc": (
        lambda: MoCo(lambda num_classes: nn.Conv2d(3, num_classes, 1), dim=4, K=8, mlp=True),
        TypeError, "mlp=True needs an encoder whose last layer is a Linear `.fc`"),
    "moco-forward-batches": (
        lambda: _moco()(torch.zeros(2, 3, 8, 8), torch.zeros(5, 3, 8, 8)),
        ValueError, "im_q and im_k must hold the same batch, got 2 and 5 images"),
    "moco-second-ema": (
        lambda: _moco().update_key_encoder(),
        RuntimeError, "order='lab' updates the key encoder inside forward"),
}


@pytest.mark.parametrize(("call", "error", "message"), CASES.values(), ids=CASES.keys())
def test_bad_input_gets_one_exact_message(call, error, message):
    with pytest.raises(error) as caught:
        call()
    assert str(caught.value) == message, (
        f"message differs\n  expected: {message}\n  got:      {caught.value}"
    )


def test_a_crash_is_told_with_the_submission_s_frames_and_the_failing_frame_s_tensors():
    """The tensors of the frame that failed are listed with shape and dtype, those on the
    failing line first, after the traceback of the submission's own code."""
    import torch

    from moco_ref.observe.tracebacks import submission_error_text

    def submission_step():
        ids = torch.arange(3)  # noqa: F841 - a local the message lists
        q, queue = torch.zeros(60, 24), torch.zeros(60, 24)
        return q @ queue  # shapes that cannot be multiplied

    try:
        submission_step()
    except RuntimeError as exc:
        text = submission_error_text(exc)
    else:  # pragma: no cover
        raise AssertionError("the matmul should fail")
    assert "in submission_step" in text and "q @ queue" in text
    listed = text.split("tensors in submission_step when it failed:\n", 1)[1].splitlines()
    assert listed[:2] == ["  q: [60, 24] float32", "  queue: [60, 24] float32"]
    assert "  ids: [3] int64" in listed


def test_an_error_the_observer_raises_about_what_was_returned_shows_no_grader_frame():
    """The observer's own TypeError about a returned value (no frame of the submission on the
    stack) is told as its words alone: a student never sees the grader's traceback."""
    import torch

    from moco_ref.observe.builder_probe import returned_pairs
    from moco_ref.observe.tracebacks import HARNESS_DIR, submission_error_text

    try:
        returned_pairs({"loss": torch.tensor(1.0)}, [], {"type": "dict"})
    except TypeError as exc:
        exc.__traceback__ = exc.__traceback__.tb_next  # as train_step meets it: no frame above
        text = submission_error_text(exc)               # the observer's is the submission's
    else:  # pragma: no cover
        raise AssertionError("a dict is no (logits, labels)")
    assert text.startswith("TypeError: forward(im_q, im_k) must return (logits, labels)")
    assert "Traceback" not in text and HARNESS_DIR not in text and "File " not in text


def test_a_submission_layer_inside_the_probe_s_encoder_shows_no_frame_of_the_grader():
    """A student's layer swapped into the probe's base_encoder (a split BatchNorm) raises
    inside the probe encoder's forward: the traceback shows the student's frames on both sides
    of it, never the grader's package (the probe's encoder lives in ``moco_ref.probe``)."""
    import torch
    from torch import nn

    from moco_ref.observe.tracebacks import HARNESS_DIR, submission_error_text
    from moco_ref.probe.builder import ProbeEncoder

    class NeedsThirtyTwo(nn.Module):
        def forward(self, x):
            if len(x) % 32:
                raise ValueError(f"a batch of {len(x)} cannot be split 32 ways")
            return x

    encoder = ProbeEncoder(12)
    encoder.body[1] = NeedsThirtyTwo()

    def students_forward(images):
        return encoder(images)

    try:
        students_forward(torch.zeros(8, 3, 8, 8))
    except ValueError as exc:
        text = submission_error_text(exc)
    else:  # pragma: no cover
        raise AssertionError("the layer raises on 8 images")
    assert "cannot be split 32 ways" in text and HARNESS_DIR not in text
    # this test's three frames (the test, students_forward, the layer), not the probe's
    assert text.count('File "') == 3 and "in students_forward" in text, text
