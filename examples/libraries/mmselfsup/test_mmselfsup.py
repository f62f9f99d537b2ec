"""mmpretrain's MoCo (the successor of mmselfsup's ``mmselfsup.models.algorithms.MoCo``), gated
by ``moco_ref.trace`` in its own process, on its own modules and its own training step.

What the library does (read from the installed ``mmpretrain/models/selfsup/moco.py``):
- the query encoder is ``model.backbone`` then ``model.neck`` (the neck returns a 1-tuple);
- the key encoder is ``model.encoder_k``, an mmengine ``ExponentialMovingAverage`` around a deep
  copy of ``Sequential(backbone, neck)``, updated inside ``loss()`` before the key forward;
  mmengine's ``momentum`` is the weight of the NEW value, so the paper's m is ``1 - momentum``;
- the dictionary is the buffer ``model.queue`` ``[feat_dim, K]`` with ``model.queue_ptr``;
- ``ContrastiveHead`` divides ``cat([l_pos, l_neg])`` by T and calls mmpretrain's
  ``CrossEntropyLoss``, which calls ``F.cross_entropy`` (labels 0);
- ``_dequeue_and_enqueue`` asserts ``K % batch == 0``: a ragged K is refused, not dropped.

Everything runs through the library's real ``BaseModel.train_step`` (data preprocessor,
``loss()``, ``parse_losses``) with an mmengine ``OptimWrapper`` around a plain ``torch.optim.SGD``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message=".*MultiScaleDeformableAttention.*")
mmengine_model = pytest.importorskip("mmengine.model")
pytest.importorskip("mmpretrain")

import mmpretrain.models  # noqa: E402,F401  (registers MoCo, ResNet, MoCoV2Neck, ContrastiveHead)
from mmengine.model import ExponentialMovingAverage  # noqa: E402
from mmengine.optim import OptimWrapper  # noqa: E402
from mmpretrain.registry import MODELS  # noqa: E402
from mmpretrain.structures import DataSample  # noqa: E402

from moco_ref.trace import MoCoParts, record_moco  # noqa: E402

BATCH, K, DIM, STEPS, T, EMA_MOMENTUM = 8, 32, 8, 8, 0.2, 0.01  # mmengine 0.01 = paper m 0.99


def build(queue_len: int = K, seed: int = 0):
    """The library's MoCo from a config dict, with a tiny ResNet of the library's own."""
    torch.manual_seed(seed)
    model = MODELS.build(dict(
        type="MoCo", queue_len=queue_len, feat_dim=DIM, momentum=EMA_MOMENTUM,
        data_preprocessor=dict(type="SelfSupDataPreprocessor"),
        backbone=dict(type="ResNet", depth=18, stem_channels=8, base_channels=8, num_stages=1,
                      strides=(1,), dilations=(1,), out_indices=(0,)),
        neck=dict(type="MoCoV2Neck", in_channels=8, hid_channels=16, out_channels=DIM),
        head=dict(type="ContrastiveHead", loss=dict(type="CrossEntropyLoss"), temperature=T)))
    return model.train()


def train(model, steps: int = STEPS) -> None:
    """The library's own training step, ``steps`` times, on tiny random two-view batches."""
    optim_wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.rand(BATCH, 3, 16, 16, generator=generator)
        views = [x + 0.05 * torch.randn(x.shape, generator=generator), x.flip(-1)]
        model.train_step(dict(inputs=views, data_samples=[DataSample() for _ in x]),
                         optim_wrapper)


# glue begin
def recorded(model, steps: int = STEPS, momentum: float | None = None):
    parts = MoCoParts(
        query=(model.backbone, model.neck),  # q = neck(backbone(im_q))[0]
        key=model.encoder_k,  # mmengine EMA wrapper; parameters under .module
        queue=lambda: model.queue, layout="dim-first", pointer=lambda: model.queue_ptr,
        temperature=model.head.temperature,
        momentum=1 - model.encoder_k.momentum if momentum is None else momentum,
        views=(model, "loss"))  # [im_q, im_k] in image order (im_k is shuffled for encoder_k)
    with record_moco(parts, name="mmpretrain MoCo") as recording:
        train(model, steps)
    return recording
# glue end


def families(report) -> set[str]:
    return {check.split("-")[0] for check in report.failed}


def passed(report, check_id: str) -> bool:
    return report.result(check_id).status.name == "PASSED"


# ---------------------------------------------------------------- the library as shipped


def test_correct_library_gets_full_marks():
    recording = recorded(build())
    report = recording.judge()
    assert report.score == report.max_score, report.text()
    assert report.failed == [] and report.not_judged == [], report.text()
    assert len(recording.steps) == STEPS  # the queue (K=32, batch 8) wrapped twice
    recording.assert_correct()


# ---------------------------------------------------------------- seeded bugs


class WrongWayEMA(ExponentialMovingAverage):
    """EMA bug: the momentum applied the wrong way round (θk ← (1−m)·θk + m·θq)."""

    def avg_func(self, averaged_param, source_param, steps):
        averaged_param.lerp_(source_param, 1 - self.momentum)


def test_seeded_ema_momentum_wrong_way_fails_I7():
    model = build()
    model.encoder_k.__class__ = WrongWayEMA
    report = recorded(model).judge()
    assert any(check.startswith("I7-") for check in report.failed), report.text()
    assert families(report) <= {"I7", "I6", "I5"}, report.text()
    for check in ("I8-loss-matches-recomputation", "I3-fifo-keeps-newest",
                  "I2-entries-are-arrival-keys", "I1-key-grads-none"):
        assert passed(report, check), report.text()
    assert report.score < report.max_score


def test_seeded_queue_pointer_not_advanced_fails_I3():
    model = build()
    enqueue = model._dequeue_and_enqueue

    def enqueue_without_advancing(keys):  # queue bug: the ring pointer never moves
        pointer = model.queue_ptr.clone()
        enqueue(keys)
        model.queue_ptr.copy_(pointer)

    model._dequeue_and_enqueue = enqueue_without_advancing
    report = recorded(model).judge()
    assert "I3-fifo-keeps-newest" in report.failed, report.text()
    assert families(report) <= {"I3", "I2"}, report.text()
    for check in ("I7-ema-law", "I8-loss-matches-recomputation", "I1-key-grads-none"):
        assert passed(report, check), report.text()


def test_seeded_positive_not_at_column_0_fails_I8():
    model = build()
    head_loss = model.head.loss

    def positive_last(pos, neg):  # loss bug: the positive goes to the last column, labels 0
        return head_loss(neg[:, :1], torch.cat([neg[:, 1:], pos], dim=1))

    model.head.loss = positive_last
    report = recorded(model).judge()
    assert any(check.startswith("I8-") for check in report.failed), report.text()
    assert families(report) <= {"I8", "I9", "I5"}, report.text()
    for check in ("I7-ema-law", "I3-fifo-keeps-newest", "I2-entries-are-arrival-keys"):
        assert passed(report, check), report.text()


# ---------------------------------------------------------------- the library's own behaviours


def test_mmengine_momentum_is_the_weight_of_the_new_value():
    """Declaring mmengine's ``momentum`` (0.01) as the paper's m fails the EMA law: the paper's
    m is ``1 - momentum`` (0.99), which is what the glue declares."""
    report = recorded(build(), momentum=EMA_MOMENTUM).judge()
    assert any(check.startswith("I7-") for check in report.failed), report.text()


def test_ragged_queue_is_refused():
    """K not a multiple of the batch: the library refuses (an assertion at the first enqueue,
    before any optimizer step), so the declared policy is ragged='refuses'."""
    model = build(queue_len=36)
    with pytest.raises(AssertionError):
        train(model, steps=1)
    assert int(model.queue_ptr) == 0
