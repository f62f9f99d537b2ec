"""Driver for ``moco-ref revisions a4a64af4c~1 a4a64af4c`` on lightning-bolts (PR #928).

Run with the cwd inside a bolts checkout (its root or its ``src``): the checkout's ``pl_bolts``
is put first on ``sys.path`` so it wins over the installed release. Whichever MoCo class that
revision has (``Moco_v2`` before #928, ``MoCo`` after) is built with the same tiny encoder,
dim, K, m, T and SGD settings, fed the same images in the batch format its ``training_step``
reads, and trained for a few steps under a real Lightning ``Trainer``.

The recorder is given one set of paths for both revisions: ``--attach __main__:Attach
--query moco.encoder_q --key moco.encoder_k --queue moco.dictionary --pointer
moco.write_pointer``. ``dictionary``/``write_pointer`` are properties, so every read is of the
live tensor (the new ``RepresentationQueue`` replaces its ``pointer`` tensor at each enqueue).
``Attach`` is a no-op module called once when training starts: under Lightning's automatic
optimization the MoCo's own first call happens inside ``optimizer.step(closure)``, too late
for the recorder to see that step begin (step 0 would merge with step 1).
"""

import os
import sys
import warnings


def _bolts_src() -> str:
    here = os.getcwd()
    for folder in (os.path.join(here, "src"), here):
        if os.path.isdir(os.path.join(folder, "pl_bolts")):
            return folder
    sys.exit(f"revision_928.py: no pl_bolts under {here} or {here}/src: run it inside a checkout")


SRC = _bolts_src()
sys.path.insert(0, SRC)

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "under review" warnings on import
    import pl_bolts  # noqa: E402
    from pl_bolts.models.self_supervised import moco as bolts_moco  # noqa: E402

if not os.path.realpath(pl_bolts.__file__).startswith(os.path.realpath(SRC) + os.sep):
    sys.exit(f"revision_928.py: pl_bolts came from {pl_bolts.__file__}, not {SRC}")

B, K, DIM, T, M, STEPS = 8, 32, 16, 0.2, 0.9, 6  # K = 4 batches: the ring wraps at step 4
SGD = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}


def tiny() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, DIM))


if os.path.exists(os.path.join(os.path.dirname(bolts_moco.__file__), "moco_module.py")):
    from pl_bolts.models.self_supervised.moco.moco_module import MoCo, collate

    class TinyMoCo(MoCo):  # after #928: the queue is a RepresentationQueue submodule
        dictionary = property(lambda self: self.queue.representations)
        write_pointer = property(lambda self: self.queue.pointer)

    def build() -> nn.Module:
        return TinyMoCo(encoder=tiny(), representation_size=DIM, num_negatives=K,
                        encoder_momentum=M, temperature=T, optimizer_params=dict(SGD),
                        lr_scheduler_params={"T_max": 1})  # Moco_v2's T_max: max_epochs = 1
else:
    from pl_bolts.models.self_supervised.moco.moco2_module import Moco_v2

    collate = None  # the default collate: ((img_1, img_2), labels), as Moco_v2 unpacks it

    class TinyMoCo(Moco_v2):  # before #928: buffers ``queue`` [dim, K] and ``queue_ptr`` [1]
        dictionary = property(lambda self: self.queue)
        write_pointer = property(lambda self: self.queue_ptr)

        def init_encoders(self, base_encoder):
            return tiny(), tiny()  # the library builds the encoder twice, by name

    def build() -> nn.Module:
        return TinyMoCo(base_encoder="tiny", emb_dim=DIM, num_negatives=K, encoder_momentum=M,
                        softmax_temperature=T, learning_rate=SGD["lr"],
                        momentum=SGD["momentum"], weight_decay=SGD["weight_decay"],
                        batch_size=B, num_workers=0)


class Attach(nn.Module):
    """What the recorder attaches to: holds the model (``moco``), its forward does nothing."""

    def __init__(self, moco: nn.Module) -> None:
        super().__init__()
        self.moco = moco

    def forward(self) -> None:
        return None


class AttachAtTrainStart(pl.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        Attach(pl_module)()


class Pairs(pl.LightningDataModule):
    name = "pairs"  # Moco_v2.training_step reads trainer.datamodule.name

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(1)
        n = STEPS * B
        view_1, view_2 = torch.randn(n, 3, 8, 8, generator=g), torch.randn(n, 3, 8, 8, generator=g)
        samples = [((view_1[i], view_2[i]), 0) for i in range(n)]
        return DataLoader(samples, batch_size=B, shuffle=False, num_workers=0,
                          collate_fn=collate)


if __name__ == "__main__":
    torch.manual_seed(0)  # the same generator state when each revision builds its model
    model = build()
    trainer = pl.Trainer(max_steps=STEPS, max_epochs=1, accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[AttachAtTrainStart()])
    trainer.fit(model, datamodule=Pairs())
    print(f"{type(model).__mro__[1].__name__}: {trainer.global_step} steps, "
          f"pointer {int(model.write_pointer.reshape(-1)[0])}")
