"""The builder probe's two-process run (gloo on the CPU, a forked rank 1) and the across-ranks
checks: the official module is kept in step and judged correct; a module that fails only on
several processes is told once; a rank that leaves does not hang the other; the record is
validated like any other; and the judge's tracing of keys to images is checked against an
independent derivation (the shard each rank owns, the permutation a shared seed draws)."""

from __future__ import annotations

import time

import pytest
import torch

from moco_ref.judge.assertions import NotExercised
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.results import Status
from moco_ref.judge.styles import validate_part
from moco_ref.observe.builder_env import cuda_on_cpu
from moco_ref.observe.builder_ranks import observe_ranks
from moco_ref.probe.builder import KEY_VIEW, BuilderProbe, ranks_probe, world_images
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import WHOLE
from moco_ref.probe.threads import one_thread
from tests.helpers.conformance_support import (
    SUBMISSIONS,
    explain,
    grade,
    load_namespace,
    round_trip,
)

PROBE = BuilderProbe()
OFFICIAL = SUBMISSIONS / "builder_correct_official_style.py"


def _ranks(path_or_class) -> dict:
    moco_class = path_or_class if isinstance(path_or_class, type) else load_namespace(
        path_or_class)["MoCo"]
    with one_thread(), cuda_on_cpu():
        return round_trip(observe_ranks(moco_class, PROBE))


@pytest.fixture(scope="module")
def official_ranks() -> dict:
    return _ranks(OFFICIAL)


def _statuses(results) -> dict:
    return {r.check_id: r for r in results}


def test_both_ranks_train_their_shard_of_the_world_batch(official_ranks):
    """Each rank's query encoder ran on exactly its own shard (global rows r·B…), every step."""
    probe = ranks_probe(PROBE)
    assert official_ranks["error"] is None and len(official_ranks["runs"]) == 2
    for rank, run in enumerate(official_ranks["runs"]):
        assert run["error"] is None and run["stage"] == "done"
        assert len(run["steps"]) == probe.steps
        for step in run["steps"]:
            queries = [e for e in step["events"] if e["role"] == "q"]
            assert sorted(queries[0]["rows"].tolist()) == list(
                range(rank * probe.batch, (rank + 1) * probe.batch))


def test_shuffle_bn_sends_images_to_the_other_rank_and_covers_the_world_batch(official_ranks):
    """With rank 0's permutation broadcast, the key encoders of both ranks together run on
    every image of the world batch exactly once, and some images cross ranks."""
    probe = ranks_probe(PROBE)
    world = probe.ranks * probe.batch
    crossed = False
    for t in range(probe.steps):
        rows = []
        for rank, run in enumerate(official_ranks["runs"]):
            keys = [e for e in run["steps"][t]["events"] if e["role"] == "k"]
            own = keys[0]["rows"].tolist()
            rows += own
            crossed |= any(not rank * probe.batch <= r < (rank + 1) * probe.batch for r in own)
        assert sorted(rows) == list(range(world))
    assert crossed


def test_ranks_hold_equal_parameters_after_every_step(official_ranks):
    """Gradients averaged over the ranks keep both query encoders identical (what DDP does)."""
    first, second = (run["steps"] for run in official_ranks["runs"])
    for a, b in zip(first, second):
        assert torch.equal(a["after_step"]["params_q"], b["after_step"]["params_q"])
        assert torch.equal(a["after_step"]["params_k"], b["after_step"]["params_k"])


def test_world_images_are_the_shards_each_rank_sees():
    probe = ranks_probe(PROBE)
    world_q, world_k = world_images(probe, 0)
    assert world_q.shape == (probe.ranks * probe.batch, 3, 8, 8)
    assert not torch.equal(world_q[:probe.batch], world_q[probe.batch:])
    assert not torch.equal(world_q, world_k)


def _evidence(ranks: dict) -> BuilderEvidence:
    record = {"probe": PROBE.to_dict(), "defined": True, "error": None,
              "environment": {"process_group": "created"}, "ranks": ranks}
    return BuilderEvidence(record, GradeOptions())


def test_written_block_is_both_ranks_keys_in_rank_order(official_ranks):
    """An independent reading of the record: rank 0's written columns are, in order, the
    normalized key outputs (of im_k) of images 0…2B−1, wherever each was computed."""
    ranks = _evidence(official_ranks).ranks
    probe = ranks.probe
    for t in range(probe.steps):
        columns, slots = ranks.written(t, 0)
        assert slots == [(KEY_VIEW, image) for image in range(probe.ranks * probe.batch)]
        start = (t * probe.ranks * probe.batch) % probe.K
        assert columns == [(start + j) % probe.K for j in range(probe.ranks * probe.batch)]


def _gather_on_wrong_dim() -> type:
    namespace = load_namespace(OFFICIAL)
    source = OFFICIAL.read_text(encoding="utf-8").replace(
        "return torch.cat(pieces, dim=0)", "return torch.cat(pieces, dim=1)")
    assert "dim=1)" in source
    exec(compile(source, "gather_on_wrong_dim.py", "exec"), namespace)
    return namespace["MoCo"]


def test_a_module_that_fails_only_on_two_processes_is_told_once():
    """Keys gathered along the feature axis: identical on one process, a shape error on two.
    The crash is told by one across-ranks check; the other is "not run"; one-process checks
    pass."""
    results, _ = grade({"MoCo": _gather_on_wrong_dim()}, "builder")
    by_id = _statuses(results)
    told = [r for r in results if r.check_id in ("I3-keys-of-all-ranks",
                                                  "I8-positive-across-ranks")]
    assert sorted(r.status.value for r in told) == sorted(
        [Status.ERROR.value, Status.NOT_JUDGED.value]), explain(results)
    error = next(r for r in told if r.status is Status.ERROR)
    assert "raised on rank" in error.message and "although it trains in one process" in \
        error.message
    assert "not run" in next(r for r in told if r.status is Status.NOT_JUDGED).message
    assert by_id["I3-fifo-keeps-newest"].status is Status.PASSED, explain(results)


def test_a_rank_that_raises_does_not_hang_the_other():
    """Rank 1 raises in its first forward while rank 0 waits in a collective: rank 0 fails
    fast (the peer's sockets close), and the record names rank 1's own error."""
    namespace = load_namespace(OFFICIAL)
    base = namespace["MoCo"]

    class FailsOnRankOne(base):
        def forward(self, im_q, im_k):
            if torch.distributed.get_rank() == 1:
                raise RuntimeError("rank one gives up")
            return super().forward(im_q, im_k)

    started = time.monotonic()
    ranks = _ranks(FailsOnRankOne)
    assert time.monotonic() - started < 15
    assert "rank one gives up" in ranks["runs"][1]["error"]
    with pytest.raises(Exception, match="raised on rank 1"):
        _evidence(ranks).ranks.runs  # noqa: B018


def test_no_two_process_run_is_not_exercised():
    ev = BuilderEvidence({"probe": PROBE.to_dict(), "defined": True, "error": None,
                          "environment": {"process_group": "existing"}}, GradeOptions())
    with pytest.raises(NotExercised, match="existing"):
        ev.ranks.runs  # noqa: B018


def test_a_record_with_unexpected_entries_in_a_rank_run_is_invalid(official_ranks):
    record = {"probe": BuilderProbe(T=0.2).to_dict(), "defined": True, "error": None,
              "ranks": {**official_ranks,
                        "runs": [{**official_ranks["runs"][0], "verdict": "full marks"}]}}
    problem = validate_part("builder", WHOLE, record, {}, GradeOptions())
    assert "rank 0" in problem and "never writes" in problem


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_rank_stuck_in_a_collective_is_stopped_and_told_once(monkeypatch):
    """Rank 0 waits in a barrier rank 1 never reaches: the collective times out, both ranks
    are ended within the run's budget, and the two across-ranks checks tell it once. (The
    ranks are forked, so a shorter collective timeout than the grader's 8 s reaches them: the
    test waits 2 s, not 8.)"""
    from datetime import timedelta

    from moco_ref.observe import builder_ranks

    monkeypatch.setattr(builder_ranks, "COLLECTIVE_TIMEOUT", timedelta(seconds=2))

    namespace = load_namespace(OFFICIAL)
    base = namespace["MoCo"]

    class WaitsOnRankZero(base):
        def forward(self, im_q, im_k):
            if torch.distributed.get_rank() == 0:
                torch.distributed.barrier()
            return super().forward(im_q, im_k)

    started = time.monotonic()
    ranks = _ranks(WaitsOnRankZero)
    assert time.monotonic() - started < builder_ranks.RANKS_SECONDS + 5
    ev = _evidence(ranks)
    with pytest.raises(Exception, match="rank"):
        ev.ranks.runs  # noqa: B018
