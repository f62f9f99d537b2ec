"""The second, short run reaches the paths of a ring that is not yet full."""

from __future__ import annotations

import pytest

from moco_ref.probe.cases import LabProbe, default_lab_probe, short_lab_probe


@pytest.mark.parametrize("probe", [default_lab_probe(), default_lab_probe(3, key="course"),
                                   LabProbe(seed=12_345)])
def test_ids_repeat_while_a_typical_queue_has_empty_slots(probe):
    short = short_lab_probe(probe)
    assert short.n_images == probe.n_images and short.seed != probe.seed
    assert short.epochs >= 2  # the second epoch's queries meet their own first-epoch keys
    assert 2 * short.n_train <= 128  # then at most half of a 128-key queue is written
    assert short.epochs * short.n_train < 240  # a LAB 07 queue is not full when it returns
    assert short.n_train >= 60  # LAB 07's batch of 60 still trains with drop_last
    # the main probe, by contrast, fills a 128-key queue before any id repeats
    assert probe.n_train >= 128


def test_the_short_run_is_recorded_beside_the_main_one():
    from moco_ref.observe.observers import observe_lab
    from moco_ref.probe.options import GradeOptions
    from tests.helpers.conformance_support import SUBMISSIONS, load_namespace

    record = observe_lab(load_namespace(SUBMISSIONS / "correct_ring_buffer.py"), GradeOptions())
    short = record["train_moco"]["short_run"]
    assert short["error"] is None and len(short["train"]) == short_lab_probe(
        default_lab_probe()).n_train
