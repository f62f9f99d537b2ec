"""The harness's contracts: the registry, style detection, option handling, plain-data
observations, judging by recomputation (never by what the submission reports), and the
reference's own code graded as a submission."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

import moco_ref
from moco_ref.judge.judge import judge
from moco_ref.judge.registry import FAMILIES, all_checks, get_check
from moco_ref.judge.results import Status
from moco_ref.observe.observers import observe
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.styles import detect_style
from tests.helpers.conformance_support import (
    SUBMISSIONS,
    explain,
    grade,
    load_namespace,
    not_passed_families,
    round_trip,
)

# =========================================================================== registry


def test_every_check_is_documented_and_grouped_by_family():
    specs = all_checks()
    ids = [s.check_id for s in specs]
    assert len(ids) == len(set(ids))
    assert {s.family for s in specs} == set(FAMILIES)
    for spec in specs:
        assert spec.check_id.startswith(spec.family + "-")
        assert len(spec.contract) > 40, spec.check_id
        assert spec.points > 0 and spec.styles
    assert [FAMILIES.index(s.family) for s in specs] == sorted(FAMILIES.index(s.family)
                                                              for s in specs)


def test_all_checks_by_style_lists_only_applicable_checks():
    lab = {s.check_id for s in all_checks("lab")}
    components = {s.check_id for s in all_checks("components")}
    assert "I9-batch-not-own-negative" in lab - components
    assert "I7-ema-skips-buffers" in components - lab
    assert "I3-fifo-keeps-newest" in lab & components
    builder = {s.check_id for s in all_checks("builder")}
    assert "contract-builder-interface" in builder - lab
    assert "I7-ema-law" in builder & lab
    assert not any(check_id.startswith(("I4", "I5", "warmup")) for check_id in builder)
    assert get_check("I3-fifo-keeps-newest").title


@pytest.mark.parametrize(("names", "style"), [
    ({"train_moco": len, "moco_warmup": len}, "lab"),
    ({"moco_warmup": len}, "lab"),
    ({"MoCo": type("MoCo", (), {})}, "builder"),
    ({"KeyQueue": moco_ref.KeyQueue, "contrastive_logits": len}, "components"),
])
def test_detect_style(names, style):
    assert detect_style(names) == style


def test_detect_style_names_what_it_looked_for():
    with pytest.raises(ValueError, match="train_moco"):
        detect_style({"x": 1})


# =========================================================================== judging

CORRECT = SUBMISSIONS / "correct_lab_order.py"


@pytest.fixture(scope="module")
def correct_record():
    return round_trip(observe(load_namespace(CORRECT), "lab", GradeOptions()))


def _tampered(record, **returned):
    record = copy.deepcopy(record)
    record["train_moco"]["returned"].update(returned)
    return record


def test_observations_are_plain_data(correct_record):
    def walk(value):
        if isinstance(value, dict):
            assert all(isinstance(k, str) for k in value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        else:
            assert value is None or isinstance(value, (bool, int, float, str, torch.Tensor))

    walk(correct_record)


def test_selected_checks_only(correct_record):
    results, _ = judge(correct_record, "lab", GradeOptions(checks=("I3",)))
    assert {r.family for r in results} == {"I3"}


def test_checks_of_other_styles_are_not_applicable_never_passed(correct_record):
    results, _ = judge(correct_record, "lab", GradeOptions())
    lab = {s.check_id for s in all_checks("lab")}
    for result in results:
        if result.check_id not in lab:
            assert result.status is Status.NOT_APPLICABLE
    builder, _ = judge({}, "builder", GradeOptions())
    applicable = {s.check_id for s in all_checks("builder")}
    for result in builder:  # nothing was observed: an error (told once), never a pass
        expected = ((Status.ERROR, Status.NOT_JUDGED) if result.check_id in applicable
                    else (Status.NOT_APPLICABLE,))
        assert result.status in expected, result
    assert sum(r.status is Status.ERROR for r in builder) == 1


def test_inferred_values(correct_record):
    _, inferred = judge(correct_record, "lab", GradeOptions())
    assert inferred["m"] == pytest.approx(0.95, abs=1e-4)
    assert (inferred["capacity"], inferred["batch_size"], inferred["order"]) == (240, 60, "lab")


def test_what_the_submission_reports_is_recomputed_not_trusted(correct_record):
    history = correct_record["train_moco"]["returned"]["history"]
    faked = _tampered(correct_record, history=[h * 0.5 for h in history], drift=0.0)
    results, _ = judge(faked, "lab", GradeOptions())
    failed = {r.check_id for r in results if r.status is Status.FAILED}
    assert failed == {"contract-history-epoch-means", "contract-drift-recomputed"}


def test_a_queue_that_was_not_produced_by_the_run_fails(correct_record):
    queue = correct_record["train_moco"]["returned"]["queue"]
    faked = _tampered(correct_record, queue=torch.nn.functional.normalize(
        torch.randn(queue.shape), dim=1))
    results, _ = judge(faked, "lab", GradeOptions())
    assert "I2" in not_passed_families(results)


def test_pinned_values(correct_record):
    results, _ = judge(correct_record, "lab", GradeOptions(expect_m=0.95, expect_capacity=240))
    assert not not_passed_families(results), explain(results)
    results, _ = judge(correct_record, "lab", GradeOptions(expect_m=0.99, expect_capacity=256,
                                                           expect_batch_size=64))
    failed = {r.check_id for r in results if r.status is Status.FAILED}
    assert failed == {"I7-momentum-in-range", "I3-fifo-keeps-newest", "contract-batch-size"}


@pytest.mark.parametrize("name", ["bug_queue_never_trimmed.py",
                                  "bug_queue_trimmed_far_too_late.py"])
def test_a_queue_never_trimmed_is_named_once_the_capacity_is_pinned(name):
    namespace = load_namespace(SUBMISSIONS / name)
    unpinned = {r.check_id: r for r in grade(namespace, "lab")[0]}["I3-fifo-keeps-newest"]
    assert unpinned.status is Status.NOT_JUDGED and "--expect-capacity" in unpinned.message
    results, _ = grade(namespace, "lab", GradeOptions(expect_capacity=240))
    failed = {r.check_id: r.message for r in results if r.status is Status.FAILED}
    assert list(failed) == ["I3-fifo-keeps-newest"], explain(results)
    assert failed["I3-fifo-keeps-newest"].startswith("the queue is never trimmed to its capacity")
    assert "got all 450 keys of the 9 steps" in failed["I3-fifo-keeps-newest"]


def test_a_ring_buffer_in_storage_order_is_named(correct_record):
    returned = correct_record["train_moco"]["returned"]
    rolled = _tampered(correct_record, queue=returned["queue"].roll(30, 0),
                       queue_ids=returned["queue_ids"].roll(30, 0))
    results, _ = judge(rolled, "lab", GradeOptions(checks=("I3",)))
    failed = {r.check_id: r.message for r in results if r.status is Status.FAILED}
    assert list(failed) == ["I3-oldest-first-order"]
    assert "storage order" in failed["I3-oldest-first-order"]


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_another_temperature_is_named_not_blamed_on_everything(correct_record):
    results, inferred = judge(correct_record, "lab", GradeOptions(temperature=0.5))
    assert {r.check_id for r in results if r.status is not Status.PASSED
            and r.status is not Status.NOT_APPLICABLE} == {"I8-temperature-divides-logits"}
    assert inferred["temperature"] == pytest.approx(0.2, rel=1e-3)


def test_a_raising_submission_is_an_error_of_the_checks_that_need_it():
    namespace = load_namespace(CORRECT)

    def train_moco(initial, x, train, epochs=15):
        raise RuntimeError("shapes do not match")

    namespace["train_moco"] = train_moco
    results, _ = grade(namespace, "lab")
    by_family = {}
    for r in results:
        if r.status is not Status.NOT_APPLICABLE:  # e.g. the builder's across-ranks check
            by_family.setdefault(r.family, set()).add(r.status)
    assert by_family["I3"] == {Status.NOT_JUDGED} and by_family["I5"] == {Status.PASSED}
    errors = [r for r in results if r.status is Status.ERROR]
    assert len(errors) == 1 and "shapes do not match" in errors[0].message  # told once
    assert errors[0].message.startswith("train_moco raised before its first step")
    not_run = [r for r in results if r.status is Status.NOT_JUDGED]
    assert all(r.message.startswith("not run: train_moco raised") and
               "shapes do not match" not in r.message for r in not_run)


def test_a_missing_warmup_fails_in_lab_and_is_not_applicable_in_components():
    namespace = dict(load_namespace(CORRECT))
    del namespace["moco_warmup"]
    results, _ = grade(namespace, "lab", GradeOptions(checks=("I5", "warmup")))
    assert {r.status for r in results} == {Status.FAILED}


# =========================================================================== the reference


@pytest.mark.parametrize("order", ["lab", "paper"])
def test_reference_train_moco_gets_full_marks(order):
    lab = pytest.importorskip("moco_ref.core.lab", reason="train_moco not importable yet")
    namespace: dict = {"moco_warmup": moco_ref.moco_warmup}

    def train_moco(initial, x, train, epochs=15):
        return lab.train_moco(initial, x, train, epochs, order=order, views=namespace["views"],
                              seed=namespace["SEED"])

    namespace["train_moco"] = train_moco
    results, inferred = grade(namespace, "lab")
    assert not not_passed_families(results), explain(results)
    assert inferred["order"] == order


# the checks of the components style, as DESIGN.md's protocol for it names them
COMPONENT_CHECKS = {
    "contract-components-defined", "I1-key-grads-none", "I2-entries-are-arrival-keys",
    "I3-fifo-keeps-newest", "I3-oldest-first-order", "I3-ids-move-with-keys",
    "I4-same-source-masked", "I4-positive-never-masked", "I5-fifo-letters", "I5-ema-values",
    "I5-temperature-probabilities", "I7-ema-law", "I7-ema-skips-buffers",
    "I8-loss-matches-recomputation", "I8-temperature-divides-logits", "warmup-returns-structure",
}
COMPONENTS = ("KeyQueue", "momentum_update", "contrastive_logits", "info_nce_loss", "moco_warmup")


def _reference_components() -> dict:
    return {name: getattr(moco_ref, name) for name in COMPONENTS}


def test_reference_components_get_full_marks():
    results, _ = grade(_reference_components(), "components")
    assert not not_passed_families(results), explain(results)
    # every check that applies passed, and those are the components style's checks
    applying = {r.check_id for r in results if r.status is not Status.NOT_APPLICABLE}
    assert {r.check_id for r in results if r.status is Status.PASSED} == applying
    assert COMPONENT_CHECKS <= applying, sorted(COMPONENT_CHECKS - applying)


class _OldestQueue(moco_ref.KeyQueue):
    """A queue that ignores arrivals once full."""

    def enqueue(self, keys, ids):
        room = self.capacity - len(self)
        if room > 0:
            super().enqueue(keys[:room], ids[:room])


def _swapped_ema(key_model, query_model, m):
    moco_ref.momentum_update(key_model, query_model, 1.0 - m)


def _unmasked_logits(q, k, queue_keys, queue_ids, ids, temperature):
    return moco_ref.contrastive_logits(q, k, queue_keys, None, None, temperature)


def _summed_loss(logits, labels=None):
    return moco_ref.info_nce_loss(logits, labels) * len(logits)


@pytest.mark.parametrize(("name", "broken", "family"), [
    ("KeyQueue", _OldestQueue, "I3"),
    ("momentum_update", _swapped_ema, "I7"),
    ("contrastive_logits", _unmasked_logits, "I4"),
    ("info_nce_loss", _summed_loss, "I8"),
])
def test_a_broken_component_fails_its_family(name, broken, family):
    namespace = _reference_components()
    namespace[name] = broken
    results, _ = grade(namespace, "components")
    assert not_passed_families(results) == {family}, explain(results)
    message = next(r.message for r in results if r.family == family and r.status is Status.FAILED)
    assert "expected" in message and "got" in message


def test_component_cases_are_drawn_again_by_the_judge():
    record = round_trip(observe(_reference_components(), "components", GradeOptions()))
    record["seed"] = 1  # the judge draws other cases than the ones observed: an error, named
    results, _ = judge(record, "components", GradeOptions())
    errors = [r for r in results if r.status is Status.ERROR]
    assert errors and all("other" in r.message and "cases" in r.message for r in errors)
    assert not any(r.status is Status.FAILED for r in results)


def test_component_cases_do_not_depend_on_what_the_process_has_loaded(monkeypatch):
    """Hypothesis borrows literal constants from the local modules in ``sys.modules``; the
    submission's process and the grader's load different ones, yet draw the same cases."""
    import hypothesis.internal.conjecture.providers as providers

    from moco_ref.probe.cases import cases_fingerprint, component_cases

    kinds = ("logits", "loss", "ema")
    before = {kind: cases_fingerprint(component_cases(kind, 0)) for kind in kinds}
    crowded = providers.Constants()
    crowded.integers.update([2, 3, 5, 7, 11, 4096])
    crowded.floats.update([0.25, 0.75, 1e-3])
    monkeypatch.setattr(providers, "_get_local_constants", lambda: crowded)
    providers.CONSTANTS_CACHE.cache.clear()  # as in a fresh process
    component_cases.cache_clear()
    try:
        after = {kind: cases_fingerprint(component_cases(kind, 0)) for kind in kinds}
    finally:
        component_cases.cache_clear()
        providers.CONSTANTS_CACHE.cache.clear()
    assert after == before


def test_probe_run_is_fast():
    import time

    namespace = load_namespace(CORRECT)
    observe(namespace, "lab", GradeOptions())  # first use of the optimizer imports lazily
    started = time.perf_counter()
    record = round_trip(observe(namespace, "lab", GradeOptions()))
    judge(record, "lab", GradeOptions())
    assert time.perf_counter() - started < 5.0
    assert not math.isnan(record["train_moco"]["seconds"])


def test_options_round_trip():
    options = GradeOptions(expect_m=0.9, checks=("I3",))
    assert GradeOptions.from_dict(options.to_dict()) == options
    assert replace(options, checks=()).selects("I9-batch-not-own-negative")


@pytest.mark.parametrize("timed_out, status", [(True, Status.TIMEOUT), (False, Status.ERROR)])
def test_an_unobserved_part_is_not_judged_and_says_why(timed_out, status):
    """A part the sandbox has no observation of reaches the judge as a typed ``Unobserved``:
    every check that needs it reports timeout/error with the reason; the others are judged."""
    from moco_ref.judge.gaps import Unobserved

    record = round_trip(observe({"moco_warmup": moco_ref.moco_warmup}, "lab", GradeOptions()))
    record["train_moco"] = Unobserved("train_moco", "it did not finish within its 3 s", timed_out)
    results, _ = judge(record, "lab", GradeOptions())
    lab_ids = {spec.check_id for spec in all_checks("lab")}
    by_family: dict = {}
    for result in (r for r in results if r.check_id in lab_ids):
        by_family.setdefault(result.family, set()).add(result.status)
    assert by_family["I5"] == by_family["warmup"] == {Status.PASSED}
    for family in ("contract", "I1", "I2", "I3", "I4", "I6", "I7", "I8", "I9"):
        assert by_family[family] == {status}, family
    message = next(r.message for r in results if r.family == "I3")
    assert message == "not judged: train_moco was not observed: it did not finish within its 3 s"


# =========================================================================== time budget


def test_judging_stops_at_the_submissions_deadline_and_says_so():
    """Judging counts toward --timeout: past the deadline no check is judged (and none
    passes); each says the time ran out. Before it, the same record is judged in full."""
    from moco_ref.judge.judge import OUT_OF_TIME

    namespace = load_namespace(SUBMISSIONS / "correct_lab_order.py")
    options = GradeOptions(style="lab")
    record = round_trip(observe(namespace, "lab", options))
    on_time, _ = judge(copy.deepcopy(record), "lab", options, deadline=float("inf"))
    assert {r.status for r in on_time} == {Status.PASSED, Status.NOT_APPLICABLE}
    late, inferred = judge(record, "lab", options, deadline=0.0)
    applicable = [r for r in late if r.status is not Status.NOT_APPLICABLE]
    assert applicable and all(r.status is Status.ERROR and r.message == OUT_OF_TIME
                              for r in applicable)
    assert [r.check_id for r in late] == [r.check_id for r in on_time]
    assert inferred == {"style": "lab"}


def test_the_query_gradient_is_recomputed_for_every_step_of_a_correct_run():
    """contract-fresh-gradients does not pass vacuously: on a correct run each step's
    recomputed gradient is what θq.grad held afterwards (within float32 rounding)."""
    from moco_ref.judge.lab_evidence import LabEvidence

    namespace = load_namespace(SUBMISSIONS / "correct_lab_order.py")
    options = GradeOptions(style="lab")
    evidence = LabEvidence(round_trip(observe(namespace, "lab", options)), options)
    items = evidence.query_gradients
    assert len(items) == len(evidence.steps) - 1
    for item in items:
        assert item.after is not None
        assert float((item.after - item.fresh).norm()) <= 1e-4 * float(item.fresh.norm())


def test_a_crash_is_told_once_with_where_the_run_was():
    """train_moco crashing once the queue is full: the first check tells the crash with the
    step, epoch and batch (probe: 150 images in batches of 60, 60, 30; the queue fills at the
    fifth batch, step 4, and the crash is the first batch after it), the submission's own
    frame and the tensors there; every other training check is "not run" in one line."""
    namespace = load_namespace(SUBMISSIONS / "bug_crash_when_queue_full.py")
    results, _ = grade(namespace, "lab")
    errors = [r for r in results if r.status is Status.ERROR]
    assert len(errors) == 1
    message = errors[0].message
    assert message.startswith("train_moco raised at step 5 (epoch 1, batch 2 of the epoch")
    assert "q @ (queue.T if len(queue) < capacity else queue)" in message
    assert "queue: [240, 24] float32" in message
    assert "moco_ref" not in message  # no grader frames
    not_run = [r for r in results if r.status is Status.NOT_JUDGED]
    assert len(not_run) >= 20
    assert all(r.message.startswith("not run: train_moco raised at step 5") for r in not_run)
