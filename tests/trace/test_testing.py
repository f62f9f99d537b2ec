"""``parametrize_with_moco_checks``: one test per check, its id the check id; a failed check
fails with the grader's message, a check that does not apply is skipped with its reason, one
declared in ``expect_fail`` is a strict expected failure; the run is recorded once."""

from __future__ import annotations

import pytest

from moco_ref.judge.registry import all_checks
from moco_ref.trace.testing import parametrize_with_moco_checks
from tests.trace.loops import plain_loop


def _params(mark) -> dict:
    return {param.id: param for param in mark.args[1]}


def test_one_test_per_builder_check_with_its_id_and_one_recording():
    calls = []

    def run():
        calls.append(1)
        return plain_loop(bug="t-multiplies")

    params = _params(parametrize_with_moco_checks(run))
    assert list(params) == [spec.check_id for spec in all_checks("builder")]
    params["I1-key-grads-none"].values[0]()  # passes
    with pytest.raises(AssertionError, match="logits multiplied by T instead of divided"):
        params["I8-temperature-divides-logits"].values[0]()
    with pytest.raises(pytest.skip.Exception, match="not applicable"):
        params["I3-keys-of-all-ranks"].values[0]()
    assert calls == [1]


def test_an_expected_failure_is_a_strict_xfail():
    params = _params(parametrize_with_moco_checks(
        lambda: plain_loop(bug="t-multiplies"),
        expect_fail={"I8-temperature-divides-logits": "known, issue 12"}))
    param = params["I8-temperature-divides-logits"]
    (mark,) = param.marks
    assert mark.name == "xfail" and mark.kwargs == {"reason": "known, issue 12", "strict": True}
    with pytest.raises(AssertionError, match="expected to fail"):
        param.values[0]()  # the failure xfail expects
