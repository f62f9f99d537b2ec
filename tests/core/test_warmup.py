"""I5: LAB 07's warm-up numbers, against values derived here in closed form."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moco_ref import moco_warmup
from moco_ref.core.warmup import _candidate_probabilities


def _closed_form_probabilities(temperature):
    # q = (1, 0); normalized keys (0.8, 0.2)/|.|, (0, 1), (-1, 0): q·k = 4/sqrt(17), 0, -1
    scores = [4 / math.sqrt(17) / temperature, 0.0, -1.0 / temperature]
    total = sum(math.exp(s) for s in scores)
    return [math.exp(s) / total for s in scores]


def test_warmup_has_the_lab_shape():
    result = moco_warmup()
    assert set(result) == {"temperature_probabilities", "FIFO", "EMA"}
    assert set(result["temperature_probabilities"]) == {"0.1", "0.5"}
    assert all(isinstance(p, float) for p in result["EMA"])


@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_temperature_probabilities_match_the_closed_form(temperature):
    got = moco_warmup()["temperature_probabilities"][str(temperature)]
    assert got == pytest.approx(_closed_form_probabilities(temperature), rel=1e-12, abs=1e-15)
    assert sum(got) == pytest.approx(1.0, abs=1e-15)


def test_lower_temperature_sharpens_the_distribution():
    probabilities = moco_warmup()["temperature_probabilities"]
    assert probabilities["0.1"][0] > probabilities["0.5"][0]


def test_fifo_drops_the_two_oldest():
    assert moco_warmup()["FIFO"] == ["c", "d", "e", "f"]


def test_ema_moves_a_tenth_of_the_way():
    # 0.9·(0, 2) + 0.1·(2, 4) = (0.2, 2.2); lerp rounds 1 − 0.9 once, hence the tolerance
    assert moco_warmup()["EMA"] == pytest.approx([0.2, 2.2], rel=1e-15, abs=1e-15)


@given(temperature=st.floats(0.05, 10.0))
def test_warmup_probabilities_follow_the_closed_form_at_any_temperature(temperature):
    """The machinery behind I5 (the reference's logits and softmax) at any T, not just the two
    the LAB prints."""
    got = _candidate_probabilities(temperature)
    assert got == pytest.approx(_closed_form_probabilities(temperature), rel=1e-9, abs=1e-300)
