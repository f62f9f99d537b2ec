"""Symmetric-loss builder modules (MoCo v2+/v3 style): each view is a query against the other
view's key. The probe sees the two (logits, labels) pairs whether the forward returns them or
returns a loss (its two cross-entropies are captured); the judge follows both halves, the keys
of both views in the queue, and names queue pollution (the first half's keys as negatives of
the second half). The variant graded is in the report."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from moco_ref.judge.registry import all_checks
from moco_ref.judge.results import Status
from moco_ref.observe.builder_probe import cross_entropy_calls, returned_pairs
from tests.helpers.conformance_support import SUBMISSIONS, explain, grade, load_namespace

pytestmark = pytest.mark.full  # the second tier (grades in-process or starts the sandbox per case)

BUILDER_IDS = {spec.check_id for spec in all_checks("builder")}
ACROSS_RANKS = {"I3-keys-of-all-ranks", "I8-positive-across-ranks"}
CORRECT = SUBMISSIONS / "builder_correct_symmetric_loss.py"


def _by_id(results) -> dict:
    return {r.check_id: r for r in results}


def _symmetric_class():
    return load_namespace(CORRECT)["MoCo"]


def test_a_loss_returning_symmetric_module_gets_full_marks_and_is_named():
    results, inferred = grade({"MoCo": _symmetric_class()}, "builder")
    by_id = _by_id(results)
    for check_id in BUILDER_IDS - ACROSS_RANKS:
        assert by_id[check_id].status is Status.PASSED, explain(results)
    # no collectives: on two processes each rank's positives are its own keys (judged, passed);
    # its queue holds its own keys, so the across-ranks queue check does not apply, as for an
    # asymmetric single-process module (the variant is never the reason)
    assert by_id["I8-positive-across-ranks"].status is Status.PASSED, explain(results)
    assert "both halves" in by_id["I8-positive-across-ranks"].message
    assert by_id["I3-keys-of-all-ranks"].status is Status.NOT_APPLICABLE
    assert "no data crossed the ranks" in by_id["I3-keys-of-all-ranks"].message
    assert inferred["variant"].startswith("symmetric (a loss")
    assert "im_q then im_k" in inferred["variant"]
    assert inferred["batch_size"] == 16  # both views' keys arrive each step


def test_a_module_returning_both_pairs_is_judged_alike():
    base = _symmetric_class()

    class ReturnsPairs(base):
        def pair(self, im_a, im_b):
            q = F.normalize(self.encoder_q(im_a), dim=1)
            k = self._keys(im_b)
            logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone().detach()],
                               dim=1) / self.T
            return (logits, torch.zeros(len(q), dtype=torch.long)), k

        def forward(self, im1, im2):
            with torch.no_grad():
                self._momentum_update_key_encoder()
            first, k2 = self.pair(im1, im2)
            second, k1 = self.pair(im2, im1)
            self._dequeue_and_enqueue(torch.cat([k1, k2]))
            return first, second

    results, inferred = grade({"MoCo": ReturnsPairs}, "builder")
    by_id = _by_id(results)
    assert all(by_id[c].status is Status.PASSED for c in BUILDER_IDS - ACROSS_RANKS), \
        explain(results)
    assert inferred["variant"].startswith("symmetric (two (logits, labels) pairs")


def test_keys_enqueued_second_view_first_are_a_fifo_too():
    """The order of the two views' keys within a step is the module's to state; it is read
    from the buffer and reported."""
    base = _symmetric_class()

    class SecondViewFirst(base):
        def forward(self, im1, im2):
            with torch.no_grad():
                self._momentum_update_key_encoder()
            loss_12, _, k2 = self.contrastive_loss(im1, im2)
            loss_21, _, k1 = self.contrastive_loss(im2, im1)
            self._dequeue_and_enqueue(torch.cat([k2, k1]))
            return loss_12 + loss_21

    results, inferred = grade({"MoCo": SecondViewFirst}, "builder")
    assert all(_by_id(results)[c].status is Status.PASSED for c in BUILDER_IDS - ACROSS_RANKS), \
        explain(results)
    assert "im_k then im_q" in inferred["variant"]


def test_queue_pollution_is_named_by_i9_alone():
    namespace = load_namespace(SUBMISSIONS / "builder_bug_symmetric_queue_pollution.py")
    results, _ = grade(namespace, "builder")
    failed = {r.check_id: r.message for r in results if r.status is Status.FAILED}
    assert list(failed) == ["I9-batch-not-own-negative"], explain(results)
    message = failed["I9-batch-not-own-negative"]
    assert message.startswith("queue pollution") and "second half" in message


def test_one_view_enqueued_is_a_queue_that_misses_keys():
    """Only the keys of im_k enqueued: half of each step's arrivals never enter the queue."""
    base = _symmetric_class()

    class OneView(base):
        def forward(self, im1, im2):
            with torch.no_grad():
                self._momentum_update_key_encoder()
            loss_12, _, k2 = self.contrastive_loss(im1, im2)
            loss_21, _, _ = self.contrastive_loss(im2, im1)
            self._dequeue_and_enqueue(k2)
            return loss_12 + loss_21

    results, _ = grade({"MoCo": OneView}, "builder")
    failed = {r.family for r in results if r.status is Status.FAILED}
    assert "I3" in failed, explain(results)
    assert not failed & {"I1", "I6", "I7", "I8", "I9"}, explain(results)


def test_returned_pairs_reads_each_structure():
    logits, labels = torch.randn(4, 9, requires_grad=True), torch.zeros(4, dtype=torch.long)
    one, loss = returned_pairs((logits, labels), [], {})
    assert len(one) == 1 and loss is None
    two, loss = returned_pairs(((logits, labels), (logits, labels)), [], {})
    assert len(two) == 2 and loss is None
    captured: list = []
    with cross_entropy_calls(captured):
        total = F.cross_entropy(logits, labels) + torch.nn.CrossEntropyLoss()(logits, labels)
    assert F.cross_entropy.__name__ == "cross_entropy"  # restored
    pairs, loss = returned_pairs(total, captured, {})
    assert len(pairs) == 2 and loss is total
    for wrong in (logits, (logits,), "logits"):
        try:
            returned_pairs(wrong, [], {"type": type(wrong).__name__})
        except TypeError as error:
            assert "must return (logits, labels)" in str(error)
        else:
            raise AssertionError(f"{wrong!r} accepted")


def test_a_declared_variant_the_module_does_not_follow_is_named_by_the_interface_check():
    from moco_ref.probe.options import GradeOptions

    official = load_namespace(SUBMISSIONS / "builder_correct_official_style.py")
    results, _ = grade(official, "builder", GradeOptions(variant="symmetric"))
    failed = {r.check_id: r.message for r in results if r.status is Status.FAILED}
    assert list(failed) == ["contract-builder-interface"], explain(results)
    assert "--variant symmetric" in failed["contract-builder-interface"]
    assert "asymmetric module" in failed["contract-builder-interface"]
    results, _ = grade({"MoCo": _symmetric_class()}, "builder", GradeOptions(variant="symmetric"))
    assert _by_id(results)["contract-builder-interface"].status is Status.PASSED
    results, _ = grade({"MoCo": _symmetric_class()}, "builder",
                       GradeOptions(variant="asymmetric"))
    assert _by_id(results)["contract-builder-interface"].status is Status.FAILED


def test_the_command_line_refuses_an_unknown_variant(capsys):
    import pytest

    from moco_ref.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["grade", str(CORRECT), "--variant", "both"])
    assert exit_info.value.code == 2
    assert "--variant" in capsys.readouterr().err


def test_malformed_pairs_are_refused_by_the_record_check():
    from moco_ref.judge.styles import validate_part
    from moco_ref.observe.builder_observer import observe_builder
    from moco_ref.probe.options import GradeOptions
    from moco_ref.probe.parts import WHOLE
    from tests.helpers.conformance_support import round_trip

    record = round_trip(observe_builder({"MoCo": _symmetric_class()}, GradeOptions()))
    assert validate_part("builder", WHOLE, record, {}, GradeOptions()) == ""
    record["run"]["steps"][0]["pairs"][1] = {"logits": "0.0", "labels": torch.zeros(8)}
    problem = validate_part("builder", WHOLE, record, {}, GradeOptions())
    assert "pair 1 logits is not a tensor" in problem


def test_keys_enqueued_before_both_halves_are_named_by_i9_alone():
    """Both views' keys enqueued before either loss: each query meets its own positive among
    the negatives, in both halves."""
    base = _symmetric_class()

    class EnqueuesFirst(base):
        def forward(self, im1, im2):
            with torch.no_grad():
                self._momentum_update_key_encoder()
                self._dequeue_and_enqueue(torch.cat([self._keys(im1), self._keys(im2)]))
            loss_12, _, _ = self.contrastive_loss(im1, im2)
            loss_21, _, _ = self.contrastive_loss(im2, im1)
            return loss_12 + loss_21

    results, _ = grade({"MoCo": EnqueuesFirst}, "builder")
    failed = {r.check_id: r.message for r in results if r.status is Status.FAILED}
    assert list(failed) == ["I9-batch-not-own-negative"], explain(results)
    assert "negatives of both halves" in failed["I9-batch-not-own-negative"]


def test_variant_symmetric_builds_a_module_with_a_symmetric_switch_symmetric():
    """A module whose constructor takes ``symmetric=False`` by default is built with
    ``symmetric=True`` under ``--variant symmetric``, and graded as the symmetric module it
    then is; without the option it is built as it defaults, one pair per forward."""
    from moco_ref.probe.options import GradeOptions

    base = _symmetric_class()

    class DefaultsToOneLoss(base):
        def __init__(self, base_encoder, dim=128, K=4096, m=0.99, T=0.1, mlp=False,
                     symmetric=False):
            super().__init__(base_encoder, dim=dim, K=K, m=m, T=T, mlp=mlp, symmetric=symmetric)

        def forward(self, im1, im2):
            if self.symmetric:
                return super().forward(im1, im2)
            with torch.no_grad():
                self._momentum_update_key_encoder()
            loss, _, k = self.contrastive_loss(im1, im2)
            self._dequeue_and_enqueue(k)
            return loss

    _, inferred = grade({"MoCo": DefaultsToOneLoss}, "builder")
    assert inferred["variant"].startswith("asymmetric")
    results, inferred = grade({"MoCo": DefaultsToOneLoss}, "builder",
                              GradeOptions(variant="symmetric"))
    assert inferred["variant"].startswith("symmetric")
    assert all(_by_id(results)[c].status is Status.PASSED for c in BUILDER_IDS - ACROSS_RANKS), \
        explain(results)
