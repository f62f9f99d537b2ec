"""The checks of a ``components`` submission (the protocol of COMPONENTS.md), under the same
ids as the ``lab`` checks of the same invariants.

The evidence is ``evidence.ComponentsEvidence``: the outputs the submission's components
gave on deterministic hypothesis-drawn cases, paired with the cases as the grader draws them
again. Every expected value comes from the reference (``KeyQueue`` via
``invariants.fifo_contents``, ``momentum_update``, ``contrastive_logits``,
``info_nce_loss``) run on inputs the grader built itself.
"""

from __future__ import annotations

import torch

from moco_ref.core.contrastive import contrastive_logits, info_nce_loss
from moco_ref.core.momentum import momentum_update
from moco_ref.judge.assertions import fail, fmt_ids, fmt_values, require
from moco_ref.judge.evidence import ComponentsEvidence
from moco_ref.judge.invariants import fifo_contents
from moco_ref.judge.registry import check

COMPONENTS = ("components",)
SCRIBBLE = 1000  # what observe adds to the caller's keys and ids after each enqueue
MASKED_BELOW = -1e3  # a logit this low has softmax probability 0 next to |logit| ≤ 1/T


@check("contract-components-defined", "the components protocol is defined", "contract", 1,
       COMPONENTS)
def check_components_defined(ev: ComponentsEvidence) -> str | None:
    """The submission defines ``KeyQueue``, ``momentum_update``, ``contrastive_logits`` and
    ``info_nce_loss`` with the reference's signatures (COMPONENTS.md)."""
    defined = ev.record.get("defined", {})
    missing = [name for name, ok in defined.items() if not ok]
    require(not missing, "the components protocol is incomplete",
            expected="KeyQueue, momentum_update, contrastive_logits, info_nce_loss",
            got=f"missing {', '.join(missing)}")
    return None


# =========================================================================== queue (I2, I3)


def _where(number: int, case, enqueue: int | None = None) -> str:
    text = f"in case {number} (capacity {case.capacity}, batches {list(case.batch_sizes)})"
    if enqueue is not None:
        text += f" after enqueue {enqueue}"
    return text


def _arrivals(stored: torch.Tensor) -> torch.Tensor:
    """Arrival numbers of stored rows (column 0 holds arrival + 1, plus the scribble when a
    queue kept a reference to the caller's tensor); −1 when not an exact arrival number."""
    if stored.ndim != 2 or stored.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64)
    first = stored[:, 0]
    first = torch.where(first > SCRIBBLE, first - SCRIBBLE, first)
    exact = first == first.round()
    return torch.where(exact, first.round().to(torch.int64) - 1, torch.full_like(first, -1,
                                                                                  dtype=torch.int64))


def _queue_runs(ev: ComponentsEvidence):
    """``(number, case, enqueue index, expected arrivals, got arrivals, stored keys, stored
    ids, len)`` after every enqueue of every queue case."""
    for number, case, output in ev.outputs("queue"):
        batches = case.batches()
        positions = [torch.arange(sum(case.batch_sizes[:i]), sum(case.batch_sizes[: i + 1]))
                     for i in range(len(batches))]
        expected = fifo_contents(positions, case.capacity)
        for e, want in enumerate(expected):
            keys, ids = output["keys"][e], output["ids"][e]
            yield number, case, e, want, _arrivals(keys), keys, ids, output["len"][e]


@check("I2-entries-are-arrival-keys", "each queue entry is the key produced at its own step",
       "I2", 2, COMPONENTS)
def check_queue_stores_copies(ev: ComponentsEvidence) -> str | None:
    """``KeyQueue`` stores copies: every entry keeps, bit for bit, the value (and id) it had when
    enqueued, even after the caller writes over the tensors it passed in."""
    for number, case, e, _, _, keys, ids, _ in _queue_runs(ev):
        batches = case.batches()
        originals = torch.cat([k for k, _ in batches])  # [total, dim]
        original_ids = torch.cat([i for _, i in batches])
        for j, row in enumerate(keys):
            matches = (originals == row).all(dim=1)
            if bool(matches.any()) and int(ids[j]) in original_ids.tolist():
                continue
            scribbled = bool(((originals + SCRIBBLE) == row).all(dim=1).any()) or int(
                ids[j]) >= SCRIBBLE
            fail("the queue keeps references to the caller's tensors, not copies" if scribbled
                 else "a queue entry changed after it was enqueued", where=_where(number, case, e),
                 expected="every entry equal to a key as it was enqueued",
                 got=f"entry {j} = {fmt_values(row)}, id {int(ids[j])}" + (
                     " (the caller's later writes show through)" if scribbled else ""))
    return None


@check("I3-fifo-keeps-newest", "the queue keeps the newest keys and drops the oldest", "I3", 2,
       COMPONENTS)
def check_queue_fifo(ev: ComponentsEvidence) -> str | None:
    """After every enqueue ``KeyQueue`` holds the last ``capacity`` keys in arrival order and
    ``len(queue)`` counts them — for any batch sizes, including batches that do not divide the
    capacity and batches larger than it."""
    for number, case, e, want, got, keys, _, length in _queue_runs(ev):
        require(length == len(want) and len(keys) == len(want), "len(queue) is not the number of "
                "keys held", where=_where(number, case, e), expected=len(want),
                got=f"len {length}, {len(keys)} rows")
        if sorted(got.tolist()) != sorted(want.tolist()):
            oldest = sorted(got.tolist()) == list(range(len(want)))
            fail("queue kept the oldest keys" if oldest else "queue did not keep the newest keys",
                 where=_where(number, case, e), expected=f"arrivals {fmt_ids(want)}",
                 got=f"arrivals {fmt_ids(got)}")
    return None


@check("I3-oldest-first-order", "the queue is returned oldest first", "I3", 1, COMPONENTS)
def check_queue_order(ev: ComponentsEvidence) -> str | None:
    """``KeyQueue.keys`` (and ``.ids``) list the entries oldest first."""
    for number, case, e, want, got, _, _, _ in _queue_runs(ev):
        if sorted(got.tolist()) == sorted(want.tolist()):
            require(torch.equal(got, want), "queue entries are not oldest first",
                    where=_where(number, case, e), expected=f"arrivals {fmt_ids(want)}",
                    got=f"arrivals {fmt_ids(got)}")
    return None


@check("I3-ids-move-with-keys", "each queued id is the source of its key", "I3", 2, COMPONENTS)
def check_queue_ids(ev: ComponentsEvidence) -> str | None:
    """``KeyQueue.ids[j]`` is the id enqueued with ``KeyQueue.keys[j]``."""
    for number, case, e, _, got, _, ids, _ in _queue_runs(ev):
        all_ids = torch.cat([i for _, i in case.batches()])
        known = got >= 0
        expected = all_ids[got[known]]
        observed = torch.where(ids >= SCRIBBLE, ids - SCRIBBLE, ids)[known]
        require(torch.equal(observed, expected), "ids are out of step with their keys",
                where=_where(number, case, e), expected=f"ids {fmt_ids(expected)}",
                got=f"ids {fmt_ids(observed)}")
    return None


# =========================================================================== EMA (I1, I7)


def _reference_ema(case, m: float | None = None):
    key, query = case.models()
    momentum_update(key, query, case.m if m is None else m)
    return key


@check("I1-key-grads-none", "no key parameter ever receives .grad", "I1", 2, COMPONENTS)
def check_ema_no_grad(ev: ComponentsEvidence) -> str | None:
    """``momentum_update`` records no autograd history: afterwards every key parameter still
    has ``.grad is None`` and is a leaf."""
    for number, case, output in ev.outputs("ema"):
        require(all(output["key_grads_none"]) and not any(output["key_grad_fn"]),
                "momentum_update left gradients or a graph on the key parameters",
                where=f"in case {number} (m = {case.m:g})",
                expected="every key parameter's .grad None, no grad_fn",
                got=f".grad set: {output['key_grads_none'].count(False)}, grad_fn: "
                    f"{sum(output['key_grad_fn'])}")
    return None


@check("I7-ema-law", "θk ← m·θk + (1 − m)·θq over all parameters, one m", "I7", 2, COMPONENTS)
def check_ema_values(ev: ComponentsEvidence) -> str | None:
    """``momentum_update(key, query, m)`` sets every key parameter to m·θk + (1 − m)·θq
    (within float64 rounding) and leaves the query model unchanged."""
    for number, case, output in ev.outputs("ema"):
        require(output["query_unchanged"], "momentum_update changed the query model",
                where=f"in case {number} (m = {case.m:g})", expected="θq unchanged",
                got="θq modified")
        expected = [p.detach() for p in _reference_ema(case).parameters()]
        got = output["key_params"]
        close = len(got) == len(expected) and all(
            g.shape == w.shape and torch.allclose(g, w, rtol=1e-9, atol=1e-12)
            for g, w in zip(got, expected))
        if close:
            continue
        swapped = [p.detach() for p in _reference_ema(case, 1.0 - case.m).parameters()]
        is_swapped = len(got) == len(swapped) and all(
            g.shape == w.shape and torch.allclose(g, w, rtol=1e-9, atol=1e-12)
            for g, w in zip(got, swapped))
        fail("the EMA coefficients are swapped: θk ← (1 − m)·θk + m·θq" if is_swapped
             else "momentum_update does not follow θk ← m·θk + (1 − m)·θq",
             where=f"in case {number} (m = {case.m:g})",
             expected=fmt_values(torch.cat([w.flatten() for w in expected])),
             got=fmt_values(torch.cat([g.flatten() for g in got])) if got else "no parameters")
    return None


@check("I7-ema-skips-buffers", "the EMA moves parameters, not buffers", "I7", 1, COMPONENTS)
def check_ema_buffers(ev: ComponentsEvidence) -> str | None:
    """``momentum_update`` leaves the key model's buffers (BatchNorm running statistics)
    untouched: the EMA is over parameters only."""
    for number, case, output in ev.outputs("ema"):
        key, _ = case.models()
        expected = [b.detach() for b in key.buffers()]
        got = output["key_buffers"]
        same = len(got) == len(expected) and all(torch.equal(g, w) for g, w in zip(got, expected))
        require(same, "momentum_update also averaged the buffers",
                where=f"in case {number} (m = {case.m:g})",
                expected="the key model's buffers unchanged",
                got="running statistics moved toward the query model's")
    return None


# =========================================================================== logits, loss


def _logits_runs(ev: ComponentsEvidence):
    for number, case, output in ev.outputs("logits"):
        t = case.tensors()
        reference = contrastive_logits(t["q"], t["k"], t["queue_keys"], t["queue_ids"], t["ids"],
                                       case.temperature)
        got = output["logits"]
        where = (f"in case {number} (B = {case.batch}, queue {case.queue_len}, "
                 f"T = {case.temperature:g}, ids {fmt_ids(t['ids'])}, queue ids "
                 f"{fmt_ids(t['queue_ids'])})")
        require(got.shape == reference.shape, "contrastive_logits must return [B, 1 + n]",
                where=where, expected=f"shape {list(reference.shape)}",
                got=f"shape {list(got.shape)}")
        yield number, case, t, reference, got, where


def _masked(logits: torch.Tensor) -> torch.Tensor:
    return torch.isneginf(logits) | (logits < MASKED_BELOW)


@check("I4-same-source-masked", "negatives from the query's own image are masked", "I4", 2,
       COMPONENTS)
def check_logits_mask(ev: ComponentsEvidence) -> str | None:
    """``contrastive_logits`` masks (−inf, or a value whose probability is 0) exactly the queue
    entries whose id equals the query's id, and no other negative."""
    for _, _, _, reference, got, where in _logits_runs(ev):
        want, have = _masked(reference)[:, 1:], _masked(got)[:, 1:]
        missing, extra = want & ~have, have & ~want
        if missing.any():
            i, j = (int(v) for v in missing.nonzero()[0])
            fail("same-source negatives were not masked", where=where,
                 expected=f"logit [{i}, {j + 1}] masked (same id)",
                 got=f"{float(got[i, j + 1]):.4g}")
        if extra.any():
            i, j = (int(v) for v in extra.nonzero()[0])
            fail("negatives of other sources were masked", where=where,
                 expected=f"logit [{i}, {j + 1}] = {float(reference[i, j + 1]):.4g}",
                 got=f"{float(got[i, j + 1]):.4g}")
    return None


@check("I4-positive-never-masked", "the positive is never masked", "I4", 1, COMPONENTS)
def check_logits_positive(ev: ComponentsEvidence) -> str | None:
    """Column 0 of ``contrastive_logits`` (the positive) is never masked."""
    for _, _, _, reference, got, where in _logits_runs(ev):
        masked = _masked(got)[:, 0]
        if masked.any():
            i = int(masked.nonzero()[0])
            fail("the positive was masked", where=where,
                 expected=f"logit [{i}, 0] = {float(reference[i, 0]):.4g}",
                 got=f"{float(got[i, 0]):.4g}")
    return None


@check("I8-temperature-divides-logits", "logits are divided by T", "I8", 1, COMPONENTS)
def check_logits_values(ev: ComponentsEvidence) -> str | None:
    """Every unmasked logit of ``contrastive_logits`` is ``q·k/T``: column 0 with the positive
    key, column 1 + j with queue entry j (oldest first)."""
    for _, case, t, reference, got, where in _logits_runs(ev):
        both = ~_masked(reference) & ~_masked(got)
        if torch.allclose(got[both], reference[both], rtol=1e-9, atol=1e-12):
            continue
        multiplied = contrastive_logits(t["q"], t["k"], t["queue_keys"], t["queue_ids"], t["ids"],
                                        1.0 / case.temperature)
        is_multiplied = torch.allclose(got[both], multiplied[both], rtol=1e-9, atol=1e-12)
        fail("logits multiplied by T instead of divided" if is_multiplied
             else "logits are not q·k/T", where=where, expected=fmt_values(reference[both]),
             got=fmt_values(got[both]))
    return None


@check("I8-loss-matches-recomputation", "the loss is −ln p⁺ as recomputed from q, k and the queue",
       "I8", 2, COMPONENTS)
def check_loss_values(ev: ComponentsEvidence) -> str | None:
    """``info_nce_loss(logits, labels=None)`` is the batch mean of −ln softmax(logits)[label],
    the label defaulting to column 0; −inf entries have probability 0."""
    for number, case, output in ev.outputs("loss"):
        t = case.tensors()
        expected = float(info_nce_loss(t["logits"], t["labels"]))
        got = output["loss"]
        if abs(got - expected) <= 1e-9 * max(1.0, abs(expected)):
            continue
        hint = ""
        if abs(got - expected * case.batch) <= 1e-9 * max(1.0, abs(expected * case.batch)):
            hint = " (summed over the batch instead of averaged)"
        fail("info_nce_loss is not the mean of −ln p⁺" + hint,
             where=f"in case {number} (B = {case.batch}, {case.columns} columns, labels "
                   f"{'given' if case.explicit_labels else 'default'})",
             expected=f"{expected:.10g}", got=f"{got:.10g}")
    return None
