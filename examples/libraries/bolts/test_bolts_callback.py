"""The recorder as a Lightning callback (``moco_ref.trace.lightning.moco_callback``) on
lightning-bolts' ``Moco_v2``: the same verdicts as the ``with record_moco`` block, the parts
named from the LightningModule when training starts."""

from __future__ import annotations

import pytest

pytest.importorskip("pytorch_lightning")

from test_bolts import EmaWrongWayRound, TinyMoco, build, datamodule, trainer  # noqa: E402

from moco_ref.trace import MoCoParts  # noqa: E402
from moco_ref.trace.lightning import moco_callback  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


def parts_of(module) -> MoCoParts:
    return MoCoParts(query=module.encoder_q, key=module.encoder_k, queue=lambda: module.queue,
                     pointer=lambda: module.queue_ptr,
                     temperature=module.hparams.softmax_temperature,
                     momentum=module.hparams.encoder_momentum)


@pytest.mark.parametrize("cls, failing", [(TinyMoco, set()),
                                          (EmaWrongWayRound, {"I7-momentum-in-range"})])
def test_the_callback_records_the_fit(cls, failing):
    callback = moco_callback(parts_of)
    fit = trainer()
    fit.callbacks.append(callback)
    fit.fit(build(cls), datamodule=datamodule())
    report = callback.recording.judge()
    assert report.report.inferred["steps_recorded"] == 10
    assert set(report.failed) == failing, report.text()
    assert not report.not_judged, report.text()
