"""Builder modules judged by what they do (issue 29.8): encoders given a head of width dim
after they are built, split-BatchNorm encoders on the probe's batches, a symmetric module that
stacks both halves into one pair, and a permuted positive named query by query."""

from __future__ import annotations

import copy

import pytest
import torch

from moco_ref.judge.builder_record import _builder_loss
from moco_ref.judge.record import Invalid
from moco_ref.judge.results import Status
from moco_ref.observe.builder_probe import stacked_halves
from moco_ref.probe.builder import BATCH_SPLITS, BuilderProbe, default_builder_probe, ranks_probe
from moco_ref.probe.options import GradeOptions, probe_key_of
from tests.helpers.conformance_support import SUBMISSIONS, grade, load_namespace

pytestmark = pytest.mark.full  # the second tier (grades in-process or starts the sandbox per case)

def _result(namespace, check_id: str):
    results, _ = grade(namespace, "builder")
    return {r.check_id: r for r in results}[check_id]


def test_an_encoder_given_a_head_of_width_dim_is_accepted_and_named():
    result = _result(load_namespace(SUBMISSIONS / "builder_correct_fc_replaced.py"),
                     "contract-builder-interface")
    assert result.status is Status.PASSED
    assert "num_classes 1000" in result.message and "width dim = " in result.message


def test_an_encoder_left_at_another_width_is_still_rejected(tmp_path):
    source = (SUBMISSIONS / "builder_correct_fc_replaced.py").read_text()
    broken = source.replace("encoder.fc = nn.Linear(in_features, dim)", "pass")
    assert broken != source
    path = tmp_path / "fc_kept.py"
    path.write_text(broken)
    result = _result(load_namespace(path), "contract-builder-interface")
    assert result.status is Status.FAILED
    assert "encoder_q.fc of width 1000" in result.message


@pytest.mark.parametrize("secret", ["", "a", "b", "c", "d", "e", "f", "g"])
def test_every_probe_batch_divides_into_split_batchnorm_slices(secret):
    options = GradeOptions(probe_key=probe_key_of(secret) if secret else "")
    probe = default_builder_probe(options)
    assert probe.batch % BATCH_SPLITS == 0 and probe.ranks_batch % BATCH_SPLITS == 0
    assert probe.ragged_K % probe.batch != 0  # the ragged run keeps its purpose
    for symmetric in (False, True):
        ranks = ranks_probe(probe, symmetric=symmetric)
        world = probe.ranks * ranks.batch * (2 if symmetric else 1)
        assert ranks.K % world == 0 and ranks.steps * world > ranks.K


def test_a_split_batchnorm_module_gets_full_marks():
    results, _ = grade(load_namespace(SUBMISSIONS / "builder_correct_split_bn.py"), "builder")
    assert all(r.status in (Status.PASSED, Status.NOT_APPLICABLE) for r in results)


def test_a_stacked_pair_is_read_as_its_two_halves():
    logits, labels = torch.randn(8, 5), torch.zeros(8, dtype=torch.long)
    halves = stacked_halves([(logits, labels)], 4)
    assert halves is not None and [len(h[0]) for h in halves] == [4, 4]
    assert torch.equal(halves[1][0], logits[4:])
    assert stacked_halves([(logits, labels)], 8) is None  # one row per image: asymmetric
    assert stacked_halves([(logits, labels), (logits, labels)], 4) is None


def _stacked_step() -> dict:
    logits, labels = torch.randn(8, 5, dtype=torch.float64), torch.zeros(8, dtype=torch.long)
    loss = float(torch.nn.functional.cross_entropy(logits, labels))
    return {"loss_returned": False, "loss": loss, "logits": logits, "labels": labels,
            "pairs": [{"logits": logits[:4], "labels": labels[:4]},
                      {"logits": logits[4:], "labels": labels[4:]}]}


def test_a_stacked_pair_is_trained_on_as_one_cross_entropy():
    step = _stacked_step()
    _builder_loss("run", 0, step)  # the mean over 2B rows: consistent
    altered = copy.deepcopy(step)
    altered["loss"] *= 2  # the sum of the halves is not what the official loop trains on
    with pytest.raises(Invalid):
        _builder_loss("run", 0, altered)


def test_a_stacked_symmetric_module_gets_full_marks():
    namespace = load_namespace(SUBMISSIONS / "builder_correct_symmetric_stacked.py")
    results, inferred = grade(namespace, "builder")
    assert all(r.status in (Status.PASSED, Status.NOT_APPLICABLE) for r in results)
    assert "stacking both directions" in inferred["variant"]


def test_a_wrong_inverse_permutation_is_named_query_by_query():
    result = _result(load_namespace(SUBMISSIONS / "builder_bug_unshuffle_wrong_inverse.py"),
                     "I8-loss-matches-recomputation")
    assert result.status is Status.FAILED
    assert result.message.startswith("each query's positive is another image's key")
    images = result.details["positive_images"]  # the image whose key each query got
    wrong = [(query, image) for query, image in enumerate(images) if image != query]
    assert wrong and sorted(images) == list(range(len(images)))  # a permutation, not the identity
    query, image = wrong[0]
    assert f"query {query}'s positive is the key of image {image}" in result.message
    assert "applied twice" in result.message


@pytest.mark.parametrize("name", ["builder_bug_unshuffle_wrong_inverse.py",
                                  "builder_bug_unshuffle_missing.py"])
def test_a_wrong_pairing_is_charged_once_and_the_rest_is_judged_on_it(name):
    """The temperature, the normalization and the negatives are judged on the keys as the
    logits paired them; the queue's order within one key batch is not I3's."""
    results, inferred = grade(load_namespace(SUBMISSIONS / name), "builder")
    by_id = {r.check_id: r for r in results}
    for check_id in ("I8-temperature-divides-logits", "I8-embeddings-normalized",
                     "I9-batch-not-own-negative", "I3-oldest-first-order",
                     "I3-fifo-keeps-newest"):
        assert by_id[check_id].status is Status.PASSED, by_id[check_id].message
    assert inferred["temperature"] == 0.2
    assert {r.family for r in results if r.status is Status.FAILED} == {"I8"}


def test_a_missing_unshuffle_is_named(tmp_path):
    source = (SUBMISSIONS / "builder_correct_official_style.py").read_text()
    broken = source.replace("            k = self._batch_unshuffle_ddp(k, restore)\n", "")
    assert broken != source
    path = tmp_path / "no_unshuffle.py"
    path.write_text(broken)
    result = _result(load_namespace(path), "I8-loss-matches-recomputation")
    assert result.status is Status.FAILED
    assert "the unshuffle is missing" in result.message


def test_a_permutation_across_ranks_names_whose_key_each_query_took():
    result = _result(load_namespace(SUBMISSIONS / "builder_bug_shuffle_not_broadcast.py"),
                     "I8-positive-across-ranks")
    assert result.status is Status.FAILED
    assert result.message.startswith("each query's positive is another image's key")
    assert "took the key of image" in result.message
    assert BuilderProbe().ranks_batch % BATCH_SPLITS == 0
