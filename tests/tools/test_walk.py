"""The P17 walk-through: the narrated events are what the trainer did, in its order."""

import pytest

from moco_ref.cli import main
from moco_ref.tools.walk import run_walk


def _stages(order):
    return [event.stage for event in run_walk(order).events]


def test_paper_order_runs_the_ema_after_the_query_update():
    stages = _stages("paper")
    assert stages.index("gradient -> θq") < stages.index("EMA -> θk") < stages.index("FIFO")
    assert stages.index("key encoder θk") < stages.index("EMA -> θk")


def test_lab_order_runs_the_ema_before_the_key_forward():
    stages = _stages("lab")
    assert stages.index("EMA -> θk") < stages.index("key encoder θk") < stages.index("loss")


@pytest.mark.parametrize("order", ["paper", "lab"])
def test_k5_enters_and_k1_leaves(order):
    walk = run_walk(order)
    assert walk.dictionary_before == ["k1", "k2", "k3", "k4"]
    assert walk.dictionary_after == ["k2", "k3", "k4", "k5"]
    text = walk.text()
    assert "k5 enters, k1 leaves" in text and "θk.grad is None: True" in text


def test_orders_differ_when_the_key_encoder_lags_behind():
    """The lab order's EMA moves θk before k5 is computed, so k5 and L differ between the
    orders here (θk ≠ θq at the start of this step), and the text shows each one's own."""
    assert run_walk("paper").loss != run_walk("lab").loss


def test_walk_command_prints_the_walk(capsys):
    assert main(["walk", "--order", "lab"]) == 0
    out = capsys.readouterr().out
    assert "order: lab" in out and "dictionary for the next batch: k2 k3 k4 k5" in out


def test_walk_rejects_unknown_order():
    with pytest.raises(ValueError, match="order"):
        run_walk("official")
