"""The recorder on training loops written by hand from MoCo's laws (``loops``): a correct loop
gets every check that applies, each seeded bug fails the check of the law it breaks and no
other, and the shapes real code takes (a shuffled key batch, an EMA wrapper, the EMA after the
optimizer step, a queue per view, validation passes) are followed."""

from __future__ import annotations

import pytest
import torch

from moco_ref.judge.results import Status
from moco_ref.trace import MoCoParts, record_moco
from tests.trace.loops import per_view_loop, plain_loop


def _applicable_all_passed(report) -> bool:
    return all(r.status in (Status.PASSED, Status.NOT_APPLICABLE) for r in report.results)


@pytest.mark.parametrize("shape", [
    {}, {"shuffle": True}, {"wrapper": True}, {"order": "paper"}, {"validation": True},
    {"data_ema": True},
], ids=["official", "shuffled-key-batch", "ema-wrapper", "paper-order", "validation-passes",
        "ema-through-data"])
def test_a_correct_loop_gets_full_marks(shape):
    report = plain_loop(**shape).judge()
    assert _applicable_all_passed(report), report.text()
    assert report.score == report.max_score == 100.0
    assert report.report.inferred["m"] == pytest.approx(0.9, abs=1e-4)


@pytest.mark.parametrize("split", [False, True], ids=["one-module", "backbone-then-projector"])
def test_a_correct_per_view_loop_gets_full_marks(split):
    report = per_view_loop(split=split).judge()
    assert _applicable_all_passed(report), report.text()


@pytest.mark.parametrize("bug, failing", [
    ("ema-swapped", {"I7-momentum-in-range"}),
    ("key-trained", {"I1-key-grads-none", "I1-keys-without-autograd"}),
    ("t-multiplies", {"I8-temperature-divides-logits"}),
    ("enqueue-query", {"I2-entries-are-arrival-keys"}),
    ("pointer-stuck", {"I3-fifo-keeps-newest", "I3-oldest-first-order"}),
    ("key-from-query-view", {"I8-key-from-other-view"}),
])
def test_each_seeded_bug_fails_its_law_alone(bug, failing):
    report = plain_loop(bug=bug).judge()
    assert set(report.failed) == failing, report.text()
    assert not report.not_judged, report.text()


def test_a_bug_in_one_queue_of_a_per_view_loop_is_named_with_its_queue():
    report = per_view_loop(bug="same-view-queue").judge()
    assert "I8-loss-matches-recomputation" in report.failed
    assert report.result("I8-loss-matches-recomputation").message.startswith("in queue ")
    assert {r.check_id for r in report.results if r.family in ("I1", "I2", "I3", "I7")
            and r.status is Status.FAILED} == set()


def test_the_swapped_ema_is_named_with_the_fitted_m():
    message = plain_loop(bug="ema-swapped").judge().result("I7-momentum-in-range").message
    assert "swapped" in message and "m = 0.9" in message and "m = 0.1" in message


class TestDeclarations:
    """What the library states about itself: T, m and its policy for a K that is not a
    multiple of the batch (the loops drop the keys that do not fit, as lightly's bank does)."""

    def test_undeclared_temperature_and_momentum_are_not_judged_and_say_so(self):
        report = plain_loop(declare=False).judge()
        assert set(report.not_judged) == {"I7-momentum-in-range",
                                          "I8-temperature-divides-logits"}
        assert "MoCoParts(temperature=" in report.result(
            "I8-temperature-divides-logits").message
        assert "MoCoParts(momentum=" in report.result("I7-momentum-in-range").message
        assert report.report.inferred["temperature"] == pytest.approx(0.2, rel=1e-4)

    def test_dropping_keys_fails_the_fifo_unless_declared(self):
        undeclared = plain_loop(k=36).judge()
        assert undeclared.failed == ["I3-fifo-keeps-newest"]
        assert "declare ragged='drops'" in undeclared.result("I3-fifo-keeps-newest").message
        declared = plain_loop(k=36).judge(ragged="drops")
        assert _applicable_all_passed(declared)
        assert "dropped, as declared" in declared.result("I3-fifo-keeps-newest").message

    def test_a_declared_refusal_fails_when_the_code_trains_anyway(self):
        report = plain_loop(k=36).judge(ragged="refuses")
        assert report.failed == ["I3-fifo-keeps-newest"]
        assert "without raising" in report.result("I3-fifo-keeps-newest").message

    def test_declared_drops_does_not_excuse_another_fifo_bug(self):
        report = plain_loop(k=36, bug="pointer-stuck").judge(ragged="drops")
        assert "I3-fifo-keeps-newest" in report.failed

    def test_an_expected_failure_is_strict(self):
        bug = plain_loop(bug="t-multiplies").judge(
            expect_fail={"I8-temperature-divides-logits": "known"})
        assert bug.failed == [] and bug.result(
            "I8-temperature-divides-logits").status is Status.NOT_APPLICABLE
        fixed = plain_loop().judge(expect_fail={"I8-temperature-divides-logits": "known"})
        assert fixed.failed == ["I8-temperature-divides-logits"]


def test_leaving_the_block_removes_every_hook():
    original = torch.nn.functional.cross_entropy
    query, key = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with record_moco(MoCoParts(query=query, key=key)):
        assert torch.nn.functional.cross_entropy is not original
    assert torch.nn.functional.cross_entropy is original
    assert not query._forward_pre_hooks and not query._forward_hooks
    assert not key._forward_pre_hooks and not key._forward_hooks
    from torch.optim import optimizer

    assert not optimizer._global_optimizer_pre_hooks and not optimizer._global_optimizer_post_hooks


def test_a_block_without_a_training_step_says_what_was_missing():
    query, key = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with record_moco(MoCoParts(query=query, key=key)) as recording:
        query(torch.randn(4, 2))
    report = recording.judge()
    assert report.failed and all("no training step was recorded" in report.result(c).message
                                 for c in report.failed)


@pytest.mark.parametrize("bad, error", [
    ({"layout": "columns"}, ValueError), ({"temperature": 0.0}, ValueError),
    ({"momentum": 1.5}, ValueError), ({"query": "encoder_q"}, TypeError),
])
def test_bad_parts_are_refused_clearly(bad, error):
    arguments = {"query": torch.nn.Linear(2, 2), "key": torch.nn.Linear(2, 2), **bad}
    with pytest.raises(error):
        MoCoParts(**arguments)


@pytest.mark.parametrize("late", [False, True], ids=["recording-first", "attached-in-closure"])
def test_a_step_whose_forward_runs_in_the_optimizers_closure_is_one_step(late):
    """Lightning's automatic optimization (and LBFGS) run forward and backward inside
    ``optimizer.step(closure)``: each call is still one recorded step, also when the recorder
    attaches inside the first closure (``trace --attach`` on a LightningModule)."""
    report = plain_loop(closure=True, attach_late=late).judge()
    assert report.report.inferred["steps_recorded"] == 8
    assert _applicable_all_passed(report), report.text()


def test_an_ema_written_through_data_is_seen_by_every_snapshot():
    """``p.data.mul_(m).add_(…)`` (mmengine's and lightly's EMA) leaves ``p._version`` as it
    was, and ``id(p.data)`` is a temporary's: a snapshot must still see every update."""
    from moco_ref.trace.recorder import _Snapshots

    layer = torch.nn.Linear(3, 2)
    snapshots = _Snapshots(list(layer.named_parameters()))
    taken = [snapshots.take()]
    for _ in range(3):
        for p in layer.parameters():
            p.data.mul_(0.5).add_(1.0)
        taken.append(snapshots.take())
    flat = torch.cat([p.detach().reshape(-1).double() for p in layer.parameters()])
    assert torch.equal(taken[-1], flat)
    assert all(not torch.equal(a, b) for a, b in zip(taken, taken[1:]))
    assert snapshots.take() is taken[-1]  # unchanged: the same tensor, no new copy
