"""The recorder as a Lightning callback: ``Trainer(callbacks=[callback])``.

    from moco_ref.trace.lightning import moco_callback

    callback = moco_callback(lambda module: MoCoParts(query=module.encoder_q, ...))
    Trainer(max_steps=10, callbacks=[callback]).fit(model)
    callback.recording.assert_correct()

The parts are named from the LightningModule when training starts; the hooks come off when it
ends (or raises). Lightning (``lightning`` or ``pytorch_lightning``) is imported only here.
"""

from __future__ import annotations

from collections.abc import Callable

from moco_ref.trace.parts import MoCoParts
from moco_ref.trace.recorder import Recording


def moco_callback(parts_of: Callable[[object], MoCoParts], name: str | None = None):
    """A Lightning ``Callback`` recording the MoCo of the module it trains."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    class RecordMoCo(Callback):
        """Records every training step of the fit (``recording``)."""

        def __init__(self) -> None:
            super().__init__()
            self.recording: Recording | None = None
            self._stop = None

        def on_train_start(self, trainer, pl_module) -> None:
            self.recording = Recording(parts_of(pl_module), name or type(pl_module).__name__)
            self._stop = self.recording.start()

        def _finish(self) -> None:
            if self._stop is not None:
                self._stop()
                self._stop = None

        def on_train_end(self, trainer, pl_module) -> None:
            self._finish()

        def on_exception(self, trainer, pl_module, exception) -> None:
            self._finish()

    return RecordMoCo()
