"""solo-learn's ``MoCoV2Plus`` (a LightningModule) gated by moco-ref's recorder.

solo-learn 1.0.2 (the only release on PyPI) builds its methods from keyword arguments (its
argparse namespace; the omegaconf configs came after it). The library's own code runs unchanged
under a real Lightning ``Trainer``: ``BaseMomentumMethod.training_step`` (the online
``encoder`` on both views, the ``momentum_encoder`` under ``no_grad``), ``MoCoV2Plus.
training_step`` (``projector`` / ``momentum_projector``, L2-normalised q and k, the symmetric
``moco_loss_func(q1, k2, queue[1]) + moco_loss_func(q2, k1, queue[0])``, then
``_dequeue_and_enqueue`` of both views' keys into the buffer ``queue`` [2, dim, K] at
``queue_ptr``), its SGD from ``configure_optimizers``, and the EMA of (encoder, projector) in
``on_train_batch_end``, after the optimizer step. Only the backbone is tiny: solo picks it by
name, and the name "vit_tiny" is pointed at a small conv net while the model is built.

The online linear classifier solo trains on detached features (``F.cross_entropy`` on
[batch, num_classes] logits) runs too; its logits are not [batch, 1 + K], so they are not MoCo's.

Each seeded bug is a small subclass or a monkeypatch, not a copy of the library's code.
Named behaviour: ``_dequeue_and_enqueue`` asserts ``queue_size % batch_size == 0``, so a K that
is not a multiple of the batch is refused (an ``AssertionError`` on the first step).
"""

from __future__ import annotations

import warnings
from unittest import mock

import pytest
import torch
from torch import nn

pl = pytest.importorskip("pytorch_lightning")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # pl_bolts (imported by solo) marks its models under review
    import solo.methods.mocov2plus
    import solo.utils.backbones
    from solo.methods import MoCoV2Plus
    from solo.utils.momentum import MomentumUpdater

from moco_ref.trace import MoCoParts, record_moco  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

B, K, DIM, T, M, STEPS = 8, 32, 16, 0.2, 0.99, 10  # 10 steps of 8 keys: the queue of 32 wraps


def config(k: int = K) -> dict:
    """solo's pretraining arguments, minimal: two large crops, SGD without a schedule, a
    constant momentum (final_tau = base_tau: no cosine ramp of tau)."""
    return dict(encoder="vit_tiny", backbone_args={}, num_classes=4, max_epochs=1, batch_size=B,
                optimizer="sgd", lars=False, lr=0.1, weight_decay=0.0, classifier_lr=0.1,
                exclude_bias_n_norm=False, accumulate_grad_batches=1,
                extra_optimizer_args={"momentum": 0.9}, scheduler="none", min_lr=0.0,
                warmup_start_lr=0.0, warmup_epochs=0, num_large_crops=2, num_small_crops=0,
                base_tau_momentum=M, final_tau_momentum=M, momentum_classifier=False,
                proj_output_dim=DIM, proj_hidden_dim=32, temperature=T, queue_size=k)


# glue begin
def tiny_backbone(**_):  # what solo's backbone name "vit_tiny" makes here: a tiny conv net
    net = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    net.num_features = 8  # solo reads the feature size of a non-ResNet backbone here
    return net


def fit_recorded(model: MoCoV2Plus, trainer, loader):
    parts = MoCoParts(query=(model.encoder, model.projector),
                      key=(model.momentum_encoder, model.momentum_projector),
                      queue=lambda: model.queue, layout="per-view", pointer=lambda: model.queue_ptr,
                      temperature=model.temperature, momentum=model.momentum_updater.base_tau)
    with record_moco(parts, name=f"solo-learn {type(model).__name__}") as recording:
        trainer.fit(model, train_dataloaders=loader)
    return recording
# glue end


def build(cls=MoCoV2Plus, k: int = K) -> MoCoV2Plus:
    torch.manual_seed(0)
    with mock.patch.object(solo.utils.backbones, "vit_tiny", tiny_backbone):
        return cls(**config(k))


def trainer(steps: int = STEPS):
    return pl.Trainer(max_steps=steps, max_epochs=1, accelerator="cpu", devices=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)


def loader(n: int = STEPS * B):
    """solo's batch: ``[indexes, [view 1, view 2], targets]``, two random 3×8×8 views."""
    g = torch.Generator().manual_seed(1)
    data = [(i, [torch.randn(3, 8, 8, generator=g), torch.randn(3, 8, 8, generator=g)], i % 4)
            for i in range(n)]
    return torch.utils.data.DataLoader(data, batch_size=B, shuffle=False, num_workers=0)


def run(cls=MoCoV2Plus, k: int = K):
    recording = fit_recorded(build(cls, k), trainer(), loader())
    return recording, recording.judge()


def families(ids) -> set[str]:
    return {check_id.split("-")[0] for check_id in ids}


# ------------------------------------------------------------------ seeded bugs

class SwappedUpdater(MomentumUpdater):
    """θk ← (1 − τ)·θk + τ·θq: the momentum applied to the wrong side."""

    @torch.no_grad()
    def update(self, online_net, momentum_net):
        for op, mp in zip(online_net.parameters(), momentum_net.parameters()):
            mp.data = (1 - self.cur_tau) * mp.data + self.cur_tau * op.data


class EmaWrongWayRound(MoCoV2Plus):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.momentum_updater = SwappedUpdater(kwargs["base_tau_momentum"],
                                               kwargs["final_tau_momentum"])


class PointerNeverAdvances(MoCoV2Plus):
    """The keys are written at the pointer, but the pointer is put back: every batch overwrites
    the same columns of both views' queues."""

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        ptr = int(self.queue_ptr)
        super()._dequeue_and_enqueue(keys)
        self.queue_ptr[0] = ptr


class TemperatureMultiplies(MoCoV2Plus):
    """The logits are multiplied by T instead of divided: solo's own ``moco_loss_func`` is
    called with 1/T during this class's training step."""

    def training_step(self, batch, batch_idx):
        library_loss = solo.methods.mocov2plus.moco_loss_func
        with mock.patch.object(solo.methods.mocov2plus, "moco_loss_func",
                               lambda q, k, queue, t: library_loss(q, k, queue, 1 / t)):
            return super().training_step(batch, batch_idx)


# ------------------------------------------------------------------ tests

@pytest.fixture(scope="module")
def correct():
    return run()


def test_library_moco_gets_full_marks(correct):
    recording, report = correct
    assert len(recording.steps) == STEPS, report.text()
    assert report.score == report.max_score, report.text()
    assert not report.failed and not report.not_judged, report.text()


def test_ema_bug_fails_the_ema_family():
    _, report = run(EmaWrongWayRound)
    assert families(report.failed) == {"I7"}, report.text()
    for passing in ("I3-fifo-keeps-newest", "I8-loss-matches-recomputation", "I1-key-grads-none"):
        assert report.result(passing).status.name == "PASSED", report.text()


def test_queue_bug_fails_fifo():
    _, report = run(PointerNeverAdvances)
    assert "I3-fifo-keeps-newest" in report.failed, report.text()
    assert families(report.failed) <= {"I2", "I3"}, report.text()
    for passing in ("I7-ema-law", "I8-loss-matches-recomputation", "I1-key-grads-none"):
        assert report.result(passing).status.name == "PASSED", report.text()


def test_loss_bug_fails_the_temperature():
    _, report = run(TemperatureMultiplies)
    assert "I8-temperature-divides-logits" in report.failed, report.text()
    assert families(report.failed) == {"I8"}, report.text()
    for passing in ("I7-ema-law", "I3-fifo-keeps-newest", "I2-entries-are-arrival-keys"):
        assert report.result(passing).status.name == "PASSED", report.text()


def test_refuses_k_not_a_multiple_of_the_batch(correct):
    """solo's named policy: ``assert self.queue_size % batch_size == 0`` in its enqueue, so
    K = 36 with batches of 8 raises on the first step (ragged='refuses')."""
    model = build(k=36)
    with pytest.raises(AssertionError):
        fit_recorded(model, trainer(), loader())
    assert int(model.queue_ptr) == 0  # nothing was enqueued
    report = correct[0].judge(ragged="refuses")  # K = 32, a multiple: full marks under it
    assert report.score == report.max_score, report.text()
