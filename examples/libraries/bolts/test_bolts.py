"""lightning-bolts' ``Moco_v2`` (a LightningModule) gated by moco-ref's recorder.

The library's own code runs unchanged under a real Lightning ``Trainer``: its ``training_step``
(EMA of the key encoder first, then its forward, its ``_dequeue_and_enqueue`` of the keys into the
``queue`` buffer [dim, K] at ``queue_ptr``, then ``F.cross_entropy`` on logits/T with the positive
at column 0), its SGD from ``configure_optimizers``. Only ``init_encoders`` is replaced, so that
the encoders are a tiny conv net instead of a torchvision ResNet (no weights, no download).

Each seeded bug is a small subclass of the library's class, not a copy of its code.
Named behaviour: ``_dequeue_and_enqueue`` asserts ``num_negatives % batch_size == 0``, so a K
that is not a multiple of the batch is refused (an ``AssertionError`` on the first step).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

pl = pytest.importorskip("pytorch_lightning")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # bolts marks every model "under review" on import
    from pl_bolts.models.self_supervised import Moco_v2

from torch.utils.data import StackDataset, TensorDataset  # noqa: E402

from moco_ref.trace import MoCoParts, record_moco  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

B, K, DIM, T, M, STEPS = 8, 32, 16, 0.2, 0.9, 10  # 10 steps of 8 keys: the queue of 32 wraps


# glue begin
class TinyMoco(Moco_v2):  # the library's Moco_v2, its encoders tiny instead of a ResNet by name
    def init_encoders(self, base_encoder):
        def tiny():
            return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(8, self.hparams.emb_dim))
        return tiny(), tiny()


def fit_recorded(model: Moco_v2, trainer, datamodule):
    parts = MoCoParts(query=model.encoder_q, key=model.encoder_k, queue=lambda: model.queue,
                      layout="dim-first", pointer=lambda: model.queue_ptr,
                      temperature=model.hparams.softmax_temperature,
                      momentum=model.hparams.encoder_momentum)
    with record_moco(parts, name=f"bolts {type(model).__name__}") as recording:
        trainer.fit(model, datamodule=datamodule)
    return recording
# glue end


def build(cls=TinyMoco, k: int = K) -> Moco_v2:
    torch.manual_seed(0)
    return cls(base_encoder="tiny", emb_dim=DIM, num_negatives=k, encoder_momentum=M,
               softmax_temperature=T, learning_rate=0.1, batch_size=B, num_workers=0)


def trainer(steps: int = STEPS):
    return pl.Trainer(max_steps=steps, accelerator="cpu", logger=False,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)


def datamodule(n: int = STEPS * B):
    """Two random 3×8×8 views per image, as bolts' ``training_step`` unpacks a batch:
    ``(img_1, img_2), _``. bolts reads ``trainer.datamodule.name``, so a datamodule it is."""
    g = torch.Generator().manual_seed(1)
    views = TensorDataset(torch.randn(n, 3, 8, 8, generator=g),
                          torch.randn(n, 3, 8, 8, generator=g))
    return pl.LightningDataModule.from_datasets(train_dataset=StackDataset(views, torch.zeros(n)),
                                                batch_size=B, num_workers=0)


def run(cls=TinyMoco, k: int = K):
    recording = fit_recorded(build(cls, k), trainer(), datamodule())
    return recording, recording.judge()


def families(ids) -> set[str]:
    return {check_id.split("-")[0] for check_id in ids}


# ------------------------------------------------------------------ seeded bugs (subclasses)

class EmaWrongWayRound(TinyMoco):
    """θk ← (1 − m)·θk + m·θq: the momentum applied to the wrong side."""

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        m = self.hparams.encoder_momentum
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * (1.0 - m) + param_q.data * m


class PointerNeverAdvances(TinyMoco):
    """The keys are written at the pointer, but the pointer is put back: every batch overwrites
    the same columns."""

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys, queue_ptr, queue):
        ptr = int(queue_ptr)
        super()._dequeue_and_enqueue(keys, queue_ptr=queue_ptr, queue=queue)
        queue_ptr[0] = ptr


class TemperatureMultiplies(TinyMoco):
    """The logits are multiplied by T instead of divided (the library's /T undone, ×T applied)."""

    def forward(self, img_q, img_k, queue):
        logits, labels, keys = super().forward(img_q, img_k, queue)
        return logits * (T * T), labels, keys


# ------------------------------------------------------------------ tests

@pytest.fixture(scope="module")
def correct():
    return run()


def test_library_moco_gets_full_marks(correct):
    recording, report = correct
    assert len(recording.steps) == STEPS, report.text()
    assert report.score == report.max_score, report.text()
    assert not report.failed and not report.not_judged


def test_ema_bug_fails_the_ema_family():
    _, report = run(EmaWrongWayRound)
    assert families(report.failed) == {"I7"}, report.text()
    # the law fits with m' = 1 - m = 0.1: the judge names the swap under the momentum's range
    assert "swapped" in report.result("I7-momentum-in-range").message, report.text()
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
    """bolts' named policy: ``assert num_negatives % batch_size == 0`` in its enqueue, so
    K = 36 with batches of 8 raises on the first step (ragged='refuses')."""
    model = build(k=36)
    with pytest.raises(AssertionError) as refused:
        fit_recorded(model, trainer(), datamodule())
    assert refused.traceback[-1].name == "_dequeue_and_enqueue"  # the library's own assert
    assert int(model.queue_ptr) == 0  # nothing was enqueued
    report = correct[0].judge(ragged="refuses")  # K = 32, a multiple: full marks under it
    assert report.score == report.max_score, report.text()
