"""Issue 29.4: a check passes only on evidence it exercised. On the session's real record of
a correct submission (``test_judge_is_total.recorded``), the returned queue is replaced:
emptied (a run that never enqueued), or made wider than the keys; the checks that read
queue entries must not pass on nothing."""

from __future__ import annotations

import pytest
import torch

from moco_ref.judge.judge import judge
from moco_ref.judge.results import Status
from moco_ref.probe.options import GradeOptions
from tests.helpers.strategies import mutate_record
from tests.judge.test_judge_is_total import recorded  # noqa: F401 - the session's record

ENTRY_CHECKS = ("I2-entries-are-arrival-keys", "I2-negatives-not-recomputed",
                "I3-oldest-first-order", "I3-ids-move-with-keys")


def _with_queue(record: dict, queue: torch.Tensor, ids: torch.Tensor) -> dict:
    changed = mutate_record(record, [])
    changed["train_moco"]["returned"]["queue"] = queue
    changed["train_moco"]["returned"]["queue_ids"] = ids
    return changed


def _by_id(results) -> dict:
    return {r.check_id: r for r in results}


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_an_empty_queue_fails_fifo_and_passes_nothing_on_its_entries(recorded):  # noqa: F811
    results = _by_id(judge(_with_queue(recorded, torch.empty(0, 24),
                                       torch.empty(0, dtype=torch.int64)), "lab",
                           GradeOptions())[0])
    fifo = results["I3-fifo-keeps-newest"]
    assert fifo.status is Status.FAILED and "never received a key" in fifo.message
    for check_id in ENTRY_CHECKS:
        assert results[check_id].status is Status.NOT_JUDGED, results[check_id]
        assert "holds no entry" in results[check_id].message


def test_a_queue_wider_than_the_keys_is_not_judged_and_says_its_width(recorded):  # noqa: F811
    queue = recorded["train_moco"]["returned"]["queue"]
    wide = torch.cat([queue, torch.zeros(len(queue), 1)], dim=1)
    results = _by_id(judge(_with_queue(recorded, wide, recorded["train_moco"]["returned"][
        "queue_ids"]), "lab", GradeOptions())[0])
    assert results["contract-returns-seven-values"].status is Status.FAILED
    for check_id in (*ENTRY_CHECKS, "I3-fifo-keeps-newest", "I8-loss-matches-recomputation"):
        result = results[check_id]
        assert result.status is Status.NOT_JUDGED, result
        assert "25 wide" in result.message and "24 wide" in result.message
        assert result.details.get("needs") == "contract-returns-seven-values"


def test_same_source_pairs_only_at_unexplained_steps_are_not_said_to_be_absent(monkeypatch):
    """I4 once said "no query met a queued key of its own image" when such pairs were there,
    at steps whose loss no form explains: it now says which steps, and that it needs I8."""
    from moco_ref.judge.invariants.loss_diagnosis import LossDiagnosis
    from moco_ref.judge.lab_evidence import LabEvidence
    from tests.helpers.conformance_support import (
        SUBMISSIONS,
        load_namespace,
        observe,
        round_trip,
    )

    options = GradeOptions()
    observations = round_trip(observe(load_namespace(SUBMISSIONS / "correct_lab_order.py"),
                                      "lab", options))
    ev = LabEvidence(observations, options)
    met = {t for t in range(len(ev.steps)) if ev.collisions(t)}
    assert met and len(met) < len(ev.steps) - 1  # steps with and without such pairs
    original = LossDiagnosis.form_at
    monkeypatch.setattr(LossDiagnosis, "form_at",  # the steps with pairs left unexplained
                        lambda self, t: None if t in met else original(self, t))
    results = judge(observations, "lab", options)[0]
    result = next(r for r in results if r.check_id == "I4-same-source-masked")
    assert result.status is Status.NOT_JUDGED, result
    assert "needs I8-loss-matches-recomputation" in result.message
    assert "queries met queued keys of their own image only at steps" in result.message
    assert "no query met" not in result.message
