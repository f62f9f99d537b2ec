"""Points follow the harm (rubric's docstring): a failure that disables families is charged
their points too, once, and the total is unchanged."""

from __future__ import annotations

import pytest

from moco_ref.judge.registry import all_checks
from moco_ref.judge.results import CheckResult, Status
from moco_ref.judge.rubric import DICTIONARY, Rubric, charge_disabled, disabled_families
from tests.helpers.conformance_support import SUBMISSIONS, grade, load_namespace


def _results(failed: dict[str, dict], status_of: dict[str, Status] | None = None):
    points = Rubric().points("lab")
    out = []
    for spec in all_checks("lab"):
        status = Status.FAILED if spec.check_id in failed else \
            (status_of or {}).get(spec.check_id, Status.PASSED)
        out.append(CheckResult(spec.check_id, spec.title, spec.family, points[spec.check_id],
                               status, "msg: x", dict(failed.get(spec.check_id, {}))))
    return out


def _share(results, families) -> float:
    return round(sum(r.max_points for r in results if r.family in families), 2)


# what I8-empty-queue-in-batch records when the in-batch branch ran at every step after the
# first (the queue never read) and when it ran at some only (bug_warmup_every_batch.py below
# shows the check writing the first)
EVERY_STEP = {"steps": [1, 2, 3, 4], "disables": list(DICTIONARY)}
SOME_STEPS = {"steps": [1, 2]}


def test_queue_never_read_costs_the_dictionary():
    before = _results({"I8-empty-queue-in-batch": EVERY_STEP})
    after = charge_disabled(before)
    lost = round(sum(r.max_points - r.points for r in after), 2)
    assert lost >= _share(before, DICTIONARY)
    assert round(sum(r.max_points for r in after), 2) == 100.0


def test_a_partial_warmup_bug_is_charged_its_own_points():
    before = _results({"I8-empty-queue-in-batch": SOME_STEPS})
    assert charge_disabled(before) == before
    assert disabled_families(before[[r.check_id for r in before]
                                    .index("I8-empty-queue-in-batch")]) == ()


def test_no_point_is_charged_twice():
    """A disabled family's own failure keeps its points: the bug costs the union."""
    failed = {"I8-empty-queue-in-batch": EVERY_STEP, "I3-fifo-keeps-newest": {}}
    before = _results(failed)
    after = charge_disabled(before)
    lost = round(sum(r.max_points - r.points for r in after), 2)
    union = {r.check_id for r in before if r.family in DICTIONARY or r.check_id in failed}
    assert lost == round(sum(r.max_points for r in before if r.check_id in union), 2)
    assert round(sum(r.max_points for r in after), 2) == 100.0
    fifo = next(r for r in after if r.check_id == "I3-fifo-keeps-newest")
    assert fifo.max_points > 0 and "charged_to" not in fifo.details


def test_named_disables_are_honoured_and_passed_checks_unaffected():
    before = _results({"contract-fresh-gradients": {"disables": ["I8"]}})
    after = charge_disabled(before)
    charged = next(r for r in after if r.check_id == "contract-fresh-gradients")
    assert charged.max_points == round(_share(before, ("I8",)) + next(
        r.max_points for r in before if r.check_id == "contract-fresh-gradients"), 2)
    assert all(r.max_points == 0 for r in after if r.family == "I8")
    assert charge_disabled(_results({})) == _results({})


@pytest.mark.parametrize("name, families", [("bug_warmup_every_batch.py", DICTIONARY),
                                            ("bug_no_zero_grad.py", ("I8",))])
def test_bundled_bugs_cost_the_family_they_disable(name, families):
    results, _ = grade(load_namespace(SUBMISSIONS / name), "lab")
    full = Rubric().points("lab", {r.check_id for r in results
                                   if r.status is Status.NOT_APPLICABLE})
    lost = round(sum(r.max_points - r.points for r in results), 2)
    assert lost >= round(sum(full.get(r.check_id, 0) for r in results if r.family in families), 2)
    assert round(sum(r.max_points for r in results), 2) == 100.0
