"""I2: old queue vectors are never recomputed; the loss reads the stored keys."""

from __future__ import annotations

from collections import Counter

import torch

from moco_ref.judge.assertions import (
    SubmissionError,
    at_step,
    fail,
    fmt_ids,
    fmt_values,
)
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.checks.common import (
    builder_where,
    case_where,
    judgeable_loss_note,
    loss_steps,
    queue_runs,
)
from moco_ref.judge.components_evidence import ComponentsEvidence
from moco_ref.judge.invariants.buffer import CHANGED, KEPT, UNKNOWN
from moco_ref.judge.lab_evidence import STORED_KINDS, LabEvidence
from moco_ref.judge.registry import check
from moco_ref.probe.cases import QueueCase

KEY_KINDS = tuple(kind for kind in STORED_KINDS if kind != "query")
_KIND_TEXT = {
    "query": ("the queue holds queries, not keys",
              "the key k produced by the key encoder", "the query q of the same view batch"),
    "raw key": ("keys were enqueued without L2 normalization",
                "the normalized key k", "the raw, unnormalized key projection"),
    "recomputed key": ("old queue entries were recomputed with a later key encoder",
                       "the key as produced at its own step",
                       "the same image re-encoded at a later step"),
    "overwritten key": ("queue entries changed after they were enqueued: they are views of one "
                        "reused tensor (a buffer written with copy_, an out= tensor), not "
                        "copies, so each new batch's keys show through the entries already "
                        "queued", "", ""),
    "unknown": ("queue entries are not copies of the keys the key encoder produced",
                "a copy of a recorded key", "a vector that matches no recorded key"),
}


_KIND_TEXT_BUILDER = {
    "query": ("the queue holds queries, not keys", "the query q of the same images"),
    "raw query": ("the queue holds unnormalized queries, not keys",
                  "the query encoder's raw output"),
    "raw key": ("keys were enqueued without L2 normalization",
                "the raw output of encoder_k (the logits' positive used the normalized key)"),
    "key": ("the queue holds normalized keys while the logits used the raw ones",
            "the normalized key"),
    "batch-normalized key": ("the queue holds keys normalized over the batch (dim=0) while "
                             "the logits used them normalized each over its features",
                             "the keys normalized over the batch (F.normalize(k, dim=0))"),
    UNKNOWN: ("the queue columns written are copies of no key",
              "a vector that matches no recorded key or query"),
}


def _key_kind(ev: BuilderEvidence) -> str:
    """What a stored key should be: as the logits' positive used it (normalized unless the
    logits are judged to use raw keys — I8's business, not I2's)."""
    try:
        fit = ev.logits
    except SubmissionError:
        return "key"
    stored = {"k-raw": "raw key", "k-batch": "batch-normalized key"}
    return stored.get(fit.form.normalize, "key") if fit.all_match else "key"


ENTRIES_ARE_ARRIVAL_KEYS = check(
    "I2-entries-are-arrival-keys",
    "each queue entry is the key produced at its own step",
    points=2,
    contract=(
        "A queue entry is the key produced at the step it was enqueued, kept bit for bit, even "
        "though the key encoder moves afterwards: old keys are never recomputed."
    ),
)


@ENTRIES_ARE_ARRIVAL_KEYS.judges('lab')
def i2_entries_are_arrival_keys_lab(ev: LabEvidence) -> str | None:
    """Every entry of the returned queue equals (to float tolerance) the normalized key the key
    encoder produced for that image at the step it was enqueued: entries are stored, not
    recomputed, and they are keys — not queries, not unnormalized projections."""
    queue = ev.require_entries("to compare with the keys of its step")
    if queue.changed_after_enqueue:
        _fail_changed_after_enqueue(queue)
    # keys stored unnormalized or normalized otherwise are still this step's keys: I8's fault
    wrong = [j for j, kind in enumerate(queue.kinds) if kind not in KEY_KINDS]
    if not wrong:
        return None
    kinds = [queue.kinds[j] for j in wrong]
    kind = max(set(kinds), key=kinds.count)
    j = next(j for j in wrong if queue.kinds[j] == kind)
    misconception, expected, got = _KIND_TEXT[kind]
    step, _ = queue.sources[j]
    where = f"queue entry {j} (id {int(queue.ids[j])}"
    where += f", enqueued at step {step})" if step >= 0 else ")"
    if kind == "overwritten key":
        expected, got = _overwritten_texts(ev, j)
    fail(misconception, where=f"{where}, {kinds.count(kind)} of {len(queue.kinds)} entries:",
         expected=expected, got=got)


def _fail_changed_after_enqueue(queue) -> None:
    """The stored entries are their keys' directions at lengths that follow their age: the
    queue was rescaled in place after the keys went in."""
    rescaled = [j for j, kind in enumerate(queue.kinds) if kind == "rescaled key"]
    by_age = sorted(rescaled, key=lambda j: int(queue.positions[j]))
    oldest, newest = by_age[0], by_age[-1]

    def entry(j: int) -> str:
        step, _ = queue.sources[j]
        return (f"entry {j} (id {int(queue.ids[j])}, enqueued at step {step}) of length "
                f"{float(queue.keys[j].norm()):.3g}")

    fail("the stored keys were changed after they were enqueued: the queue was rescaled in "
         "place (queue.div_(…), queue.mul_(…) on the stored tensor), so every entry is its "
         "key's direction at a length that depends on how long it has been stored",
         where=f"the returned queue, {len(rescaled)} of {len(queue.kinds)} entries:",
         expected="each entry the L2-normalized key as it was enqueued (length 1), unchanged "
                  "until it leaves",
         got=f"the oldest {entry(oldest)}, the newest {entry(newest)}")


def _overwritten_texts(ev: LabEvidence, j: int) -> tuple[str, str]:
    """What entry ``j`` of a queue of views of one buffer should hold and what it shows."""
    queue = ev.queue
    flat_ids = torch.cat(queue.arrival_ids)
    shown = int(queue.shown[j])
    step = next(t for t, block in enumerate(queue.arrival_positions)
                if shown in block.tolist())
    row = queue.arrival_positions[step].tolist().index(shown)
    own = int(queue.positions[j])
    return (f"the key of id {int(flat_ids[own])} as it was enqueued",
            f"the key of id {int(flat_ids[shown])} from step {step} (row {row} of a later batch "
            "written into the same memory)")


@ENTRIES_ARE_ARRIVAL_KEYS.judges('builder')
def i2_entries_are_arrival_keys_builder(ev: BuilderEvidence) -> str | None:
    """The columns a step writes into the ``[dim, K]`` buffer are copies of that step's keys —
    ``encoder_k``'s outputs for ``im_k``, normalized as the logits' positive is — not the
    queries, not unnormalized projections."""
    expected_kind = _key_kind(ev)
    for step, trace in zip(ev.steps, ev.columns):
        written = [j for j, kind in enumerate(trace.kinds) if kind not in (KEPT, CHANGED)]
        wrong = [j for j in written if trace.kinds[j] != expected_kind]
        if not wrong:
            continue
        kind = Counter(trace.kinds[j] for j in wrong).most_common(1)[0][0]
        misconception, got = _KIND_TEXT_BUILDER[kind]
        fail(misconception, where=f"{builder_where(step.index)}, buffer columns "
                                  f"{fmt_ids([j for j in wrong if trace.kinds[j] == kind])}:",
             expected=f"the {ev.probe.batch} keys k = normalize(encoder_k(im_k))"
                      if expected_kind == "key" else "the keys as the logits used them",
             got=got)
    return None


@ENTRIES_ARE_ARRIVAL_KEYS.judges('components')
def i2_entries_are_arrival_keys_components(ev: ComponentsEvidence) -> str | None:
    """``KeyQueue`` stores copies: every entry keeps, bit for bit, the value (and id) it had when
    enqueued, even after the caller writes over the tensors it passed in."""
    for number, case, e, _, _, keys, ids, _ in queue_runs(ev):
        batches = case.batches()
        originals = torch.cat([k for k, _ in batches])  # [total, dim]
        original_ids = torch.cat([i for _, i in batches])
        for j, row in enumerate(keys):
            matches = (originals == row).all(dim=1)
            if bool(matches.any()) and int(ids[j]) in original_ids.tolist():
                continue
            scribbled = bool(((originals + QueueCase.SCRIBBLE) == row).all(dim=1).any()) or int(
                ids[j]) >= QueueCase.SCRIBBLE
            fail("the queue keeps references to the caller's tensors, not copies" if scribbled
                 else "a queue entry changed after it was enqueued",
                 where=case_where(number, case, e),
                 expected="every entry equal to a key as it was enqueued",
                 got=f"entry {j} = {fmt_values(row)}, id {int(ids[j])}" + (
                     " (the caller's later writes show through)" if scribbled else ""))
    return None


NEGATIVES_NOT_RECOMPUTED = check(
    "I2-negatives-not-recomputed",
    "the loss uses stored keys, not re-encoded ones",
    points=1,
    contract=(
        "The negatives of a step's loss are the stored queue entries, not the queued samples "
        "re-encoded by the current key encoder."
    ),
)


@NEGATIVES_NOT_RECOMPUTED.judges('lab')
def i2_negatives_not_recomputed_lab(ev: LabEvidence) -> str | None:
    """The negatives of each step are the queue's stored keys; the key encoder is not run
    again on the queued images (that would make old keys move with θk, which MoCo's queue
    exists to avoid)."""
    ev.require_entries("whose use as a negative could be followed")
    diagnosis, steps = loss_steps(ev, "whether the negatives were recomputed")
    if diagnosis.steps_where("negatives", ("recomputed",), steps):
        step = next(s for s in ev.steps if s.recomputed is not None)
        fail("the queue was re-encoded with the current key encoder before the loss",
             where=at_step(step.index, step.ids),
             expected="negatives read from the stored queue",
             got=f"{len(step.recomputed[1])} queued images re-encoded by the key encoder and "
                 "used as negatives")
    return judgeable_loss_note(diagnosis, steps, len(ev.steps))


@NEGATIVES_NOT_RECOMPUTED.judges('builder')
def i2_negatives_not_recomputed_builder(ev: BuilderEvidence) -> str | None:
    """A queue column that survives a step keeps its exact bits: an entry keeps the value it
    had when enqueued (the negatives are stored keys, never rewritten or re-encoded)."""
    for step, trace in zip(ev.steps, ev.columns):
        changed = [j for j, kind in enumerate(trace.kinds) if kind == CHANGED]
        if changed:
            largest = float(trace.distance[changed].max())
            fail("old queue entries changed after they were enqueued",
                 where=f"{builder_where(step.index)}, buffer columns {fmt_ids(changed)}:",
                 expected="every surviving column bitwise equal to its value before the step",
                 got=f"{len(changed)} columns changed by up to {largest:.2g}")
    return None
