"""Issue 29.3: the judge is total. On a real record of a correct submission, mutated in
tensors' shapes, widths, values and dtypes, lists' lengths, repeated steps and dropped keys,
every check ends passed, failed, not judged or not applicable — never "error" from the
judge's own exception — with a reason that shows no grader path and no traceback.

The record is made once per session by the sandbox's own observation (``observe_sandboxed``,
as ``moco-ref record`` does). Mutated records are judged twice: as the pipeline would (each
part validated first, an invalid one replaced by an ``Unobserved`` entry), and directly, as
if validation had let everything through."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from moco_ref.judge.judge import judge
from moco_ref.judge.results import Status
from moco_ref.judge.styles import validate_part
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import Unobserved
from moco_ref.run.pipeline import observe_sandboxed
from tests.helpers.conformance_support import SUBMISSIONS
from tests.helpers.strategies import mutate_record, record_mutations

pytestmark = pytest.mark.full  # the second tier: a sandboxed record, then its mutations

PARTS = ("train_moco", "moco_warmup")
GRADER_MARKS = ("/work/", "moco_ref/judge", "Traceback", 'File "')
ENDINGS = {Status.PASSED, Status.FAILED, Status.NOT_JUDGED, Status.NOT_APPLICABLE}
# per profile: few examples by default (dev, ci), many under HYPOTHESIS_PROFILE=thorough
_DEFAULT = settings.default.max_examples
_FEW = settings(max_examples=_DEFAULT if _DEFAULT > 100 else 25,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="session")
def recorded() -> dict:
    record = observe_sandboxed(str(SUBMISSIONS / "correct_lab_order.py"), GradeOptions(),
                               isolation="processes")
    assert record["gradable"] and not record["missing"], record
    return record["observations"]


def _validated(observations: dict, options: GradeOptions) -> dict:
    """The record as the pipeline judges it: an invalid part becomes ``Unobserved``."""
    meta = {key: value for key, value in observations.items() if key not in PARTS}
    out = dict(observations)
    for name in PARTS:
        if name in observations:
            problem = validate_part("lab", name, observations[name], meta, options)
            if problem:
                out[name] = Unobserved(name, f"discarded: {problem}", False)
    return out


def _own_exception(result) -> bool:
    return "grader_exception" in result.details


def _hold(results) -> None:
    for result in results:
        assert result.status in ENDINGS or (
            result.status is Status.ERROR and not _own_exception(result)), result
        shown = result.message + " ".join(str(v) for v in result.details.values())
        assert not any(mark in shown for mark in GRADER_MARKS), (result.check_id, shown)


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_the_record_of_a_correct_submission_has_full_marks(recorded):
    results, _ = judge(recorded, "lab", GradeOptions())
    assert {r.status for r in results} <= {Status.PASSED, Status.NOT_APPLICABLE}


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
@_FEW
@given(mutations=record_mutations())
def test_pipeline_judging_of_a_mutated_record_is_total(recorded, mutations):
    options = GradeOptions()
    results, _ = judge(_validated(mutate_record(recorded, mutations), options), "lab", options)
    _hold(results)
    # a record the validator accepts is one the judge follows without an exception of its own
    assert not [r.check_id for r in results if _own_exception(r)], mutations


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
@_FEW
@given(mutations=record_mutations())
def test_judging_an_unvalidated_mutated_record_is_total(recorded, mutations):
    options = GradeOptions()
    results, _ = judge(mutate_record(recorded, mutations), "lab", options)
    _hold(results)


def test_a_grader_exception_is_not_judged_in_the_submissions_terms(recorded):
    """The fallback itself: a record whose events are not a list makes the grader's reading
    raise; every check it reaches is not judged, without the grader's traceback."""
    broken = mutate_record(recorded, [])
    broken["train_moco"]["events"] = {"not": "a list"}
    results, _ = judge(broken, "lab", GradeOptions())
    followed = [r for r in results if r.status is not Status.NOT_APPLICABLE
                and r.status is not Status.PASSED and r.family not in ("I5", "warmup")]
    assert followed and all(r.status is Status.NOT_JUDGED for r in followed), followed
    assert any(_own_exception(r) and "could not follow" in r.message for r in followed)
    _hold(results)
