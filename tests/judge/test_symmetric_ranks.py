"""Symmetric-loss builder modules (MoCo v2+/v3 style) on two processes: the two-process run is
made for them too, with a queue sized for both views' keys (2B per rank and step), and the two
across-ranks checks judge them — both halves' positives (I8-positive-across-ranks) and both
views' keys of every rank in the queue, in rank order, in the order the module enqueues them
(I3-keys-of-all-ranks). A symmetric module is never exempted: a check that cannot be judged
says "not judged", and the maximum stays the style's."""

from __future__ import annotations

import pytest
import torch

from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.judge import judge
from moco_ref.judge.results import Status, SubmissionReport
from moco_ref.observe.builder_observer import observe_builder
from moco_ref.probe.builder import KEY_VIEW, QUERY_VIEW, BuilderProbe, ranks_probe
from moco_ref.probe.options import GradeOptions
from tests.helpers.conformance_support import (
    SUBMISSIONS,
    explain,
    grade,
    load_namespace,
    round_trip,
)

pytestmark = pytest.mark.full  # the second tier (grades in-process or starts the sandbox per case)

ACROSS_RANKS = ("I3-keys-of-all-ranks", "I8-positive-across-ranks")
CORRECT_DDP = SUBMISSIONS / "builder_correct_symmetric_ddp.py"
OFFICIAL = SUBMISSIONS / "builder_correct_official_style.py"


def _by_id(results) -> dict:
    return {r.check_id: r for r in results}


def _ddp_class() -> type:
    return load_namespace(CORRECT_DDP)["MoCo"]


@pytest.fixture(scope="module")
def ddp_record() -> dict:
    return round_trip({**observe_builder({"MoCo": _ddp_class()}, GradeOptions()),
                       "style": "builder"})


@pytest.fixture(scope="module")
def official_not_applicable() -> set[str]:
    results, _ = grade(load_namespace(OFFICIAL), "builder")
    return {r.check_id for r in results if r.status is Status.NOT_APPLICABLE}


# --------------------------------------------------------------------------- the run


def test_the_symmetric_queue_of_the_two_process_run_holds_whole_steps():
    """K for a symmetric module: a multiple of both views' keys of the world batch, not below
    the official run's K, and the queue still wraps within the run; the official K is kept."""
    probe = BuilderProbe()
    official, symmetric = ranks_probe(probe), ranks_probe(probe, symmetric=True)
    block = 2 * probe.ranks * probe.ranks_batch
    assert official.K == probe.ranks_K
    assert symmetric.K % block == 0 and symmetric.K >= probe.ranks_K
    assert symmetric.steps * block > symmetric.K
    assert (symmetric.batch, symmetric.steps) == (official.batch, official.steps)


def test_a_symmetric_module_is_trained_on_two_processes(ddp_record):
    """The record has both ranks' runs, every step with both pairs, the queue sized for both
    views (the official assert K % keys == 0 holds, so nothing raised); it is a valid record
    (every rank's forwards recomputed from the probe's images)."""
    from moco_ref.judge.styles import validate_part
    from moco_ref.probe.parts import WHOLE

    record = {key: value for key, value in ddp_record.items() if key != "style"}
    assert validate_part("builder", WHOLE, record, {}, GradeOptions()) == ""
    ranks = ddp_record["ranks"]
    probe = ranks_probe(BuilderProbe(), symmetric=True)
    assert ranks["error"] is None and len(ranks["runs"]) == 2
    for run in ranks["runs"]:
        assert run["error"] is None and run["stage"] == "done", run["error"]
        assert list(run["initial"]["queue"].shape) == [probe.dim, probe.K]
        assert all(len(step["pairs"]) == 2 for step in run["steps"])


def test_the_written_block_is_both_views_of_each_rank_in_rank_order(ddp_record):
    """An independent reading: rank 0's columns hold, from the pointer, rank 0's keys of im_q
    and of im_k, then rank 1's (one gather of both views), and the halves of every rank are
    matched to the views their queries are of."""
    ev = BuilderEvidence(ddp_record, GradeOptions())
    ranks = ev.ranks
    B, K = ranks.probe.batch, ranks.probe.K
    per_step = 2 * ranks.world * B
    fit = ev.logits
    assert fit.all_match
    for t in range(ranks.steps):
        columns, slots = ranks.written(t, 0)
        assert slots == [(view, image) for rank in range(ranks.world)
                         for view in (QUERY_VIEW, KEY_VIEW) for image in ranks.rows_of(rank)]
        start = (t * per_step) % K
        assert columns == [(start + j) % K for j in range(per_step)]
        for rank in range(ranks.world):
            halves = ranks.positives(t, rank, fit.form, fit.temperature)
            assert [(h.query_view, h.key_view) for h in halves] == [(0, 1), (1, 0)]
            for half in halves:
                assert [key.slot for key in half.used] == [
                    (half.key_view, image) for image in ranks.rows_of(rank)]
    assert ranks.shuffled_across_ranks()


def test_the_correct_symmetric_module_passes_both_checks(ddp_record, official_not_applicable):
    results, inferred = judge(ddp_record, "builder", GradeOptions())
    by_id = _by_id(results)
    assert inferred["variant"].startswith("symmetric")
    for check_id in ACROSS_RANKS:
        assert by_id[check_id].status is Status.PASSED, explain(results)
    assert "both views' keys" in by_id["I3-keys-of-all-ranks"].message
    assert "both halves" in by_id["I8-positive-across-ranks"].message
    assert all(r.status is not Status.FAILED for r in results), explain(results)
    assert {r.check_id for r in results if r.status is Status.NOT_APPLICABLE} == \
        official_not_applicable


# --------------------------------------------------------------------------- the bugs


@pytest.mark.parametrize("name, failed", [
    ("builder_bug_symmetric_shuffle_not_broadcast.py", {"I8-positive-across-ranks"}),
    ("builder_bug_symmetric_keys_not_gathered.py", {"I3-keys-of-all-ranks"}),
    ("builder_bug_symmetric_single_gpu_port.py", set(ACROSS_RANKS)),
])
def test_cross_rank_bugs_of_symmetric_modules_fail_and_keep_the_maximum(
        name, failed, official_not_applicable):
    """Each bug fails its check (never "not applicable"); the other across-ranks check passes;
    the maximum is the official module's (nothing of the style left out)."""
    results, _ = grade(load_namespace(SUBMISSIONS / name), "builder")
    by_id = _by_id(results)
    for check_id in ACROSS_RANKS:
        expected = Status.FAILED if check_id in failed else Status.PASSED
        assert by_id[check_id].status is expected, explain(results)
    assert {r.check_id for r in results if r.status is Status.NOT_APPLICABLE} == \
        official_not_applicable
    if "I8-positive-across-ranks" in failed:
        message = by_id["I8-positive-across-ranks"].message
        assert "not broadcast" in message and "against the key of" in message
    if "I3-keys-of-all-ranks" in failed:
        assert by_id["I3-keys-of-all-ranks"].message.startswith(
            "keys are not gathered across ranks"), explain(results)


def test_a_half_whose_keys_come_back_to_the_wrong_rank_is_named_with_its_views():
    """Only im_q's keys are unshuffled with rank 0's slice on every rank (right on one
    process): on two, rank 1's second half (q of im_k against the key of im_q) is handed rank
    0's keys; the first half is right, and the queue holds the keys the queries used."""
    base = _ddp_class()

    class SliceOfRankZero(base):
        @torch.no_grad()
        def _keys_of_q(self, images):
            shuffled, restore = self._batch_shuffle_ddp(images)
            k = torch.nn.functional.normalize(self.encoder_k(shuffled), dim=1)
            pieces = [torch.empty_like(k) for _ in range(torch.distributed.get_world_size())]
            torch.distributed.all_gather(pieces, k)
            everything = torch.cat(pieces)
            return everything[restore.view(-1, len(k))[0]]

        def forward(self, im_q, im_k):
            q1 = torch.nn.functional.normalize(self.encoder_q(im_q), dim=1)
            q2 = torch.nn.functional.normalize(self.encoder_q(im_k), dim=1)
            with torch.no_grad():
                self._momentum_update_key_encoder()
                k1 = self._keys_of_q(im_q)
                k2 = self._keys(im_k)
            first, second = self._half(q1, k2), self._half(q2, k1)
            self._dequeue_and_enqueue(torch.cat([k1, k2], dim=0))
            return first, second

    results, _ = grade({"MoCo": SliceOfRankZero}, "builder")
    by_id = _by_id(results)
    i8 = by_id["I8-positive-across-ranks"]
    assert i8.status is Status.FAILED, explain(results)
    assert "shuffle is not undone" in i8.message
    assert "rank 1" in i8.message and "(q of im_k against the key of im_q)" in i8.message
    assert [r.check_id for r in results if r.status is Status.FAILED] == [
        "I8-positive-across-ranks"], explain(results)


# --------------------------------------------------------------------------- enqueue orders


def test_the_order_the_module_enqueues_in_is_followed():
    """Second view's keys first, or each view gathered and enqueued by its own call: FIFOs in
    rank order both; keys gathered in reverse rank order are not."""
    base = _ddp_class()

    class Variants(base):
        layout = "second view first"

        def forward(self, im_q, im_k):
            q1 = torch.nn.functional.normalize(self.encoder_q(im_q), dim=1)
            q2 = torch.nn.functional.normalize(self.encoder_q(im_k), dim=1)
            with torch.no_grad():
                self._momentum_update_key_encoder()
                k1, k2 = self._keys(im_q), self._keys(im_k)
            first, second = self._half(q1, k2), self._half(q2, k1)
            if self.layout == "second view first":
                self._dequeue_and_enqueue(torch.cat([k2, k1]))
            elif self.layout == "view by view":
                self._dequeue_and_enqueue(k1)
                self._dequeue_and_enqueue(k2)
            else:  # reverse rank order
                keys = torch.cat([k1, k2])
                pieces = [torch.empty_like(keys) for _ in range(torch.distributed.get_world_size())]
                torch.distributed.all_gather(pieces, keys)
                everything = torch.cat(pieces[::-1])
                ptr = int(self.queue_ptr)
                self.queue[:, ptr:ptr + len(everything)] = everything.T
                self.queue_ptr[0] = (ptr + len(everything)) % self.K
            return first, second

    for layout, passes in (("second view first", True), ("view by view", True),
                           ("reverse rank order", False)):
        module = type("MoCo", (Variants,), {"layout": layout})
        results, inferred = grade({"MoCo": module}, "builder")
        by_id = _by_id(results)
        i3 = by_id["I3-keys-of-all-ranks"]
        assert (i3.status is Status.PASSED) is passes, (layout, explain(results))
        assert by_id["I8-positive-across-ranks"].status is Status.PASSED, explain(results)
        if layout == "second view first":
            assert "im_k then im_q" in inferred["variant"]
        if not passes:
            assert "out of rank order" in i3.message, i3.message


def test_pairs_returned_second_half_first_are_matched_to_their_views(ddp_record):
    """The two-process run's pairs of every rank step swapped (q of im_k's half first): each
    pair is still matched to the view of its queries, every positive the right key."""
    record = round_trip(ddp_record)
    for run in record["ranks"]["runs"]:
        for step in run["steps"]:
            step["pairs"] = step["pairs"][::-1]
            step["logits"], step["labels"] = (step["pairs"][0]["logits"],
                                              step["pairs"][0]["labels"])
    ev = BuilderEvidence(record, GradeOptions())
    fit = ev.logits
    for t in range(ev.ranks.steps):
        for rank in range(ev.ranks.world):
            halves = ev.ranks.positives(t, rank, fit.form, fit.temperature)
            assert [(h.query_view, h.key_view) for h in halves] == [(1, 0), (0, 1)]
            for half in halves:
                assert [key.slot for key in half.used] == [
                    (half.key_view, image) for image in ev.ranks.rows_of(rank)]


# --------------------------------------------------------------------------- not judged


def test_a_symmetric_module_without_its_two_process_run_is_not_judged(ddp_record):
    """No two-process run (a process group already existed): both checks say "not judged:"
    with what was missing, never "not applicable", and the maximum does not shrink."""
    full, _ = judge(ddp_record, "builder", GradeOptions())
    record = {key: value for key, value in ddp_record.items() if key != "ranks"}
    record["environment"] = {**record["environment"], "process_group": "existing"}
    results, _ = judge(record, "builder", GradeOptions())
    by_id = _by_id(results)
    for check_id in ACROSS_RANKS:
        assert by_id[check_id].status is Status.NOT_JUDGED, explain(results)
        assert by_id[check_id].message.startswith("not judged: the two-process run was not made")
    maximum = [SubmissionReport("m.py", "builder", True, r).max_score for r in (full, results)]
    assert maximum[0] == maximum[1] > 0
