"""Meta-tests of the grader: each check family, run against a copy of the reference broken in
the one way that family exists to catch, must fail - so a check that silently stops checking
is caught by the suite itself. The unbroken reference passes everything
(tests/judge/test_conformance_judge.py)."""

from __future__ import annotations

import pytest
import torch

import moco_ref
from moco_ref.core import contrastive, lab, step
from moco_ref.core.step import MoCoTrainer
from moco_ref.judge.judge import judge
from moco_ref.observe.observers import observe
from moco_ref.probe.options import GradeOptions
from tests.helpers.conformance_support import explain, not_passed_families, round_trip


def _reference_namespace(warmup=moco_ref.moco_warmup) -> dict:
    namespace: dict = {"moco_warmup": warmup}

    def train_moco(initial, x, train, epochs=15):
        return lab.train_moco(initial, x, train, epochs, views=namespace["views"],
                              seed=namespace["SEED"])

    namespace["train_moco"] = train_moco
    return namespace


def _keys_with_autograd(self, view_k):
    for param in self.encoder_k.parameters():
        param.requires_grad_(True)
    k = torch.nn.functional.normalize(step.projection_of(self.encoder_k(view_k)), dim=1)
    k.sum().backward(retain_graph=True)  # the key encoder collects .grad
    return k.detach()


def _enqueue_queries(self, k, ids):
    MoCoTrainer_enqueue(self, self._last_q, ids)


def _remember_q(self, view_q):
    self._last_q = MoCoTrainer_encode_queries(self, view_q).detach()
    return self._last_q + 0 * MoCoTrainer_encode_queries(self, view_q)


MoCoTrainer_enqueue = MoCoTrainer._dequeue_and_enqueue
MoCoTrainer_encode_queries = MoCoTrainer._encode_queries


def _keep_oldest(self, keys, ids):
    room = self.capacity - len(self)
    if room > 0:
        original_enqueue(self, keys[:room], ids[:room])


original_enqueue = moco_ref.KeyQueue.enqueue


def _wrong_warmup():
    result = moco_ref.moco_warmup()
    result["FIFO"] = ["a", "b", "c", "d"]
    return result


def _ema_with_stale_query(self, loss):
    stale = [p.detach().clone() for p in self.encoder_q.parameters()]
    original_update(self, loss)
    with torch.no_grad():
        for p_k, p_q in zip(self.encoder_k.parameters(), stale):
            p_k.lerp_(p_q, 1 - self.m)


original_update = MoCoTrainer._update_query_encoder


def _swapped_momentum(key_model, query_model, m):
    original_momentum(key_model, query_model, 1.0 - m)


original_momentum = step.momentum_update


def _logits_times_t(q, k, queue_keys, queue_ids, ids, temperature):
    return original_logits(q, k, queue_keys, queue_ids, ids, 1.0 / temperature)


original_logits = step.contrastive_logits


def _enqueue_first(self, q, k, ids):
    self._dequeue_and_enqueue(k, ids)
    return original_logits_and_labels(self, q, k, ids)


original_logits_and_labels = MoCoTrainer._logits_and_labels

BREAKS = {
    "I1": [(MoCoTrainer, "_encode_keys", _keys_with_autograd)],
    "I2": [(MoCoTrainer, "_encode_queries", _remember_q),
           (MoCoTrainer, "_dequeue_and_enqueue", _enqueue_queries)],
    "I3": [(moco_ref.KeyQueue, "enqueue", _keep_oldest)],
    "I4": [(contrastive, "same_source_pairs",
            lambda ids, queue_ids: (torch.zeros(0, dtype=torch.long),) * 2)],
    "I6": [(MoCoTrainer, "_update_query_encoder", _ema_with_stale_query),
           (MoCoTrainer, "_momentum_update_key_encoder", lambda self: None)],
    "I7": [(step, "momentum_update", _swapped_momentum)],
    "I8": [(step, "contrastive_logits", _logits_times_t)],
    "I9": [],  # a whole step that enqueues before the loss, below
}


@pytest.mark.parametrize("family", sorted(BREAKS) + ["I5"])
def test_each_family_fails_on_a_reference_broken_its_way(family, monkeypatch):
    """The break applies while the reference is observed (the submission's side) and is undone
    before judging, so the judge's own recomputation uses the intact reference."""
    namespace = _reference_namespace(_wrong_warmup if family == "I5" else moco_ref.moco_warmup)
    options = GradeOptions()
    with monkeypatch.context() as patch:
        for owner, name, replacement in BREAKS.get(family, []):
            patch.setattr(owner, name, replacement)
        if family == "I9":
            patch.setattr(MoCoTrainer, "_dequeue_and_enqueue", MoCoTrainer_enqueue)
            patch.setattr(MoCoTrainer, "step", _step_enqueueing_before_the_loss)
        observations = round_trip(observe(namespace, "lab", options))
    results, _ = judge(observations, "lab", options)
    assert family in not_passed_families(results), explain(results)


def _step_enqueueing_before_the_loss(self, view_q, view_k, ids):
    q = self._encode_queries(view_q)
    self._momentum_update_key_encoder()
    k = self._encode_keys(view_k)
    logits, labels, in_batch = _enqueue_first(self, q, k, ids)
    loss = contrastive.info_nce_loss(logits, labels)
    self._update_query_encoder(loss)
    return step.StepResult(loss.detach(), logits.detach(), labels, q.detach(), k, ids,
                           in_batch)
