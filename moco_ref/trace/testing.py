"""MoCo's checks in a library's own test suite: one pytest test per check, its id the check id.

    from moco_ref.trace import MoCoParts, record_moco
    from moco_ref.trace.testing import parametrize_with_moco_checks

    def run_my_moco():
        model = MyMoCo(...)
        parts = MoCoParts(query=model.encoder_q, key=model.encoder_k, queue=lambda: model.queue,
                          pointer=lambda: model.queue_ptr, temperature=0.07, momentum=0.999)
        with record_moco(parts) as recording:
            train(model, steps=10)           # your own loop, unchanged
        return recording

    @parametrize_with_moco_checks(run_my_moco, ragged="drops")
    def test_moco(moco_check):
        moco_check()

The run is recorded once per test session, when the first of its tests runs. A failed check
fails its test with the grader's message (the misconception, expected and got, the step); one
that could not be judged fails too, saying what was missing; a check that does not apply is
skipped with the reason; one declared in ``expect_fail`` is an expected failure (strict).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from moco_ref.judge.registry import all_checks
from moco_ref.judge.results import Status

BUILDER = "builder"


def moco_check_ids() -> list[str]:
    """Every check a recording is judged by, in the grader's order."""
    return [spec.check_id for spec in all_checks(BUILDER)]


def parametrize_with_moco_checks(run: Callable[[], object], **declarations):
    """A ``pytest.mark.parametrize`` over every check: the test receives ``moco_check``, a
    function that asserts its check's verdict on ``run()``'s recording (``declarations``:
    ``ragged``, ``expect_fail`` as ``Recording.judge`` takes them)."""
    import pytest

    expect_fail = dict(declarations.get("expect_fail") or {})

    @lru_cache(maxsize=1)
    def judged():
        return run().judge(**declarations)

    params = []
    for check_id in moco_check_ids():
        marks = [pytest.mark.xfail(reason=expect_fail[check_id], strict=True)] \
            if check_id in expect_fail else []
        params.append(pytest.param(_asserter(judged, check_id, check_id in expect_fail),
                                   id=check_id, marks=marks))
    return pytest.mark.parametrize("moco_check", params)


def _asserter(judged, check_id: str, expected_to_fail: bool):
    def moco_check() -> None:
        import pytest

        result = judged().result(check_id)
        if expected_to_fail and result.status is Status.NOT_APPLICABLE and \
                result.message.startswith("expected to fail"):
            raise AssertionError(result.message)  # xfail(strict) counts it as the failure
        if result.status is Status.NOT_APPLICABLE:
            pytest.skip(f"{check_id}: not applicable: {result.message}")
        if result.status is not Status.PASSED:
            raise AssertionError(f"{check_id} {result.status.value}: {result.message}")

    moco_check.__name__ = f"moco_check[{check_id}]"
    return moco_check


def assert_moco(recording, **declarations) -> None:
    """One assertion for the whole recording: raises ``AssertionError`` with the grader's table
    (each not-passed check with its evidence) unless every check that applies passed."""
    recording.assert_correct(**declarations)
