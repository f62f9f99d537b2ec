"""lightly's MoCo, gated by moco-ref's recorder (``moco_ref.trace``) in lightly's own process.

The model and the loop are written as lightly's docs MoCo example (``examples/pytorch/moco.py``
of lightly 1.5.x) writes them, made tiny: a backbone + ``MoCoProjectionHead``, a momentum copy
made with ``copy.deepcopy`` + ``deactivate_requires_grad``, ``update_momentum`` called by the
loop at the start of each step, and the dictionary inside ``NTXentLoss(memory_bank_size=(K,
dim))``: a ``MemoryBankModule`` (``criterion.memory_bank``) whose buffer ``bank`` is ``[K, dim]``
(rows; ``feature_dim_first`` only transposes the copy handed to the loss) with a ring pointer
``bank_ptr`` (a ``[1]`` long tensor). It stores the L2-normalised keys, and when a batch does
not fit before the end of the bank it writes the rows that fit and drops the rest (the pointer
goes back to 0): lightly's policy when K is not a multiple of the batch.

Everything run here is lightly's own code; each seeded bug is a one-line monkeypatch or a small
subclass in this file.
"""

from __future__ import annotations

import copy

import pytest
import torch
from lightly.loss import NTXentLoss
from lightly.models.modules import MoCoProjectionHead
from lightly.models.modules.memory_bank import MemoryBankModule
from lightly.models.utils import deactivate_requires_grad, update_momentum
from lightly.utils.scheduler import cosine_schedule
from torch import nn

from moco_ref.trace import MoCoParts, record_moco

BATCH, DIM, K, STEPS = 8, 16, 32, 10  # the bank (K = 32) wraps twice in 10 steps
EPOCHS = 10  # the schedule's length; the test runs its first epoch (m = 0.99)
T = 0.5  # NTXentLoss's default temperature, which lightly's example keeps


class MoCo(nn.Module):
    """lightly's example model, with a tiny backbone."""

    def __init__(self, backbone: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.projection_head = MoCoProjectionHead(feature_dim, 32, DIM)
        self.backbone_momentum = copy.deepcopy(self.backbone)
        self.projection_head_momentum = copy.deepcopy(self.projection_head)
        deactivate_requires_grad(self.backbone_momentum)
        deactivate_requires_grad(self.projection_head_momentum)

    def forward(self, x):
        query = self.backbone(x).flatten(start_dim=1)
        return self.projection_head(query)

    def forward_momentum(self, x):
        key = self.backbone_momentum(x).flatten(start_dim=1)
        return self.projection_head_momentum(key).detach()


def tiny_moco() -> MoCo:
    backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
    return MoCo(backbone, feature_dim=8)


def dataloader(steps: int = STEPS, seed: int = 1):
    """Batches shaped as lightly's MoCoV2Transform gives them: ``((x_query, x_key), label)``,
    two noisy views of the same random 3×8×8 images."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        images = torch.rand(BATCH, 3, 8, 8, generator=generator)
        views = [images + 0.1 * torch.randn(images.shape, generator=generator) for _ in "qk"]
        yield views, torch.zeros(BATCH, dtype=torch.long)


def train_one_epoch(model, criterion, optimizer, loader, epoch=0, momentum_update=update_momentum):
    """The example's loop body, as lightly writes it (EMA first, then forward/backward/step)."""
    momentum_val = cosine_schedule(epoch, EPOCHS, 0.99, 1)
    for batch in loader:
        x_query, x_key = batch[0]
        momentum_update(model.backbone, model.backbone_momentum, m=momentum_val)
        momentum_update(model.projection_head, model.projection_head_momentum, m=momentum_val)
        query = model(x_query)
        key = model.forward_momentum(x_key)
        loss = criterion(query, key)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def record(bank_size: int = K, patch=None, momentum_update=update_momentum, steps: int = STEPS):
    """Build lightly's MoCo, optionally seed one bug (``patch(criterion)``), train one tiny
    epoch under the recorder and return the recording."""
    torch.manual_seed(0)
    model = tiny_moco()
    criterion = NTXentLoss(memory_bank_size=(bank_size, DIM))
    if patch is not None:
        patch(criterion)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.06)
    # glue begin
    parts = MoCoParts(
        query=(model.backbone, model.projection_head),
        key=(model.backbone_momentum, model.projection_head_momentum),
        queue=lambda: criterion.memory_bank.bank, layout="rows",
        pointer=lambda: criterion.memory_bank.bank_ptr,
        temperature=T, momentum=cosine_schedule(0, EPOCHS, 0.99, 1),
    )
    with record_moco(parts, name="lightly MoCo") as recording:
        train_one_epoch(model, criterion, optimizer, dataloader(steps),
                        momentum_update=momentum_update)
    # glue end
    return recording


def families(failed: list[str]) -> set[str]:
    return {check_id.split("-")[0] for check_id in failed}


# ---------------------------------------------------------------- the correct library code


def test_the_library_as_installed_is_what_we_think():
    """The shapes the glue names: a [K, dim] bank, a [1] pointer, the example's m and T."""
    criterion = NTXentLoss(memory_bank_size=(K, DIM))
    assert criterion.temperature == T
    assert tuple(criterion.memory_bank.bank.shape) == (K, DIM)
    assert tuple(criterion.memory_bank.bank_ptr.shape) == (1,)
    assert cosine_schedule(0, EPOCHS, 0.99, 1) == pytest.approx(0.99)


def test_lightly_moco_gets_full_marks():
    recording = record()
    assert len(recording.steps) == STEPS
    report = recording.judge()
    print(report.text())
    assert report.failed == [], report.text()
    assert report.not_judged == [], report.text()
    assert report.score == report.max_score, report.text()
    recording.assert_correct()


# ---------------------------------------------------------------- lightly's ragged policy


def test_bank_not_a_multiple_of_the_batch_drops_keys():
    """K = 20, batch 8: at the third enqueue only 4 keys fit; lightly writes them, drops the
    other 4 and sends the pointer back to 0. The FIFO law catches exactly that drop, and
    declaring lightly's policy (ragged='drops') names it and passes."""
    recording = record(bank_size=20)
    plain = recording.judge()
    assert plain.failed == ["I3-fifo-keeps-newest"], plain.text()
    assert "dropped while" in str(plain.result("I3-fifo-keeps-newest").details.get("got", ""))
    declared = recording.judge(ragged="drops")
    assert declared.failed == [], declared.text()
    assert declared.score == declared.max_score, declared.text()
    assert "dropped, as declared" in declared.result("I3-fifo-keeps-newest").message
    refuses = recording.judge(ragged="refuses")
    assert "I3-fifo-keeps-newest" in refuses.failed


# ---------------------------------------------------------------- seeded bugs


def ema_the_wrong_way_round(model, model_ema, m):
    """θk ← (1−m)·θk + m·θq: the momentum applied to the wrong side."""
    for ema, online in zip(model_ema.parameters(), model.parameters()):
        ema.data = ema.data * (1.0 - m) + online.data * m


def ema_skips_the_biases(model, model_ema, m):
    """lightly's EMA on the weights only: every bias of the key encoder stays as copied."""
    for (name, ema), online in zip(model_ema.named_parameters(), model.parameters()):
        if name.endswith("weight"):
            ema.data = ema.data * m + online.data * (1.0 - m)


class BankThatNeverAdvances(MemoryBankModule):
    """lightly's bank, with the pointer put back after each enqueue: every batch overwrites
    the same rows."""

    def _dequeue_and_enqueue(self, batch):
        ptr = self.bank_ptr.clone()
        super()._dequeue_and_enqueue(batch)
        self.bank_ptr.copy_(ptr)


def bank_never_advances(criterion: NTXentLoss) -> None:
    criterion.memory_bank = BankThatNeverAdvances(size=(K, DIM))


def temperature_multiplies(criterion: NTXentLoss) -> None:
    """lightly divides the logits by ``criterion.temperature``: 1/T there gives cos·T."""
    criterion.temperature = 1.0 / T


class PositiveAtColumn1(nn.CrossEntropyLoss):
    """The cross-entropy told that the positive is column 1 (the first negative)."""

    def forward(self, logits, labels):
        return super().forward(logits, labels + 1)


def positive_not_at_column_0(criterion: NTXentLoss) -> None:
    criterion.cross_entropy = PositiveAtColumn1(reduction="mean")


SEEDED_BUGS = [  # (the bug, how it is seeded, the check it must fail)
    ("ema the wrong way round", {"momentum_update": ema_the_wrong_way_round},
     "I7-momentum-in-range"),
    ("ema skips the biases", {"momentum_update": ema_skips_the_biases}, "I7-ema-law"),
    ("the bank pointer never advances", {"patch": bank_never_advances}, "I3-fifo-keeps-newest"),
    ("temperature multiplies", {"patch": temperature_multiplies},
     "I8-temperature-divides-logits"),
    ("positive not at column 0", {"patch": positive_not_at_column_0},
     "I8-loss-matches-recomputation"),
]


@pytest.mark.parametrize(("bug", "kwargs", "check"),
                         [pytest.param(*case, id=case[0]) for case in SEEDED_BUGS])
def test_seeded_bug_fails_its_invariant(bug, kwargs, check):
    recording = record(**kwargs)
    report = recording.judge()
    print(report.text())
    assert report.score < report.max_score, f"{bug}: {report.text()}"
    assert check in report.failed, f"{bug}: {report.failed}\n{report.text()}"
    # every other family's checks stay passed: the bug is named where it is
    assert families(report.failed) == families([check]), f"{bug}: {report.text()}"
    assert report.not_judged == [], report.text()
    with pytest.raises(AssertionError, match=check):
        recording.assert_correct()
