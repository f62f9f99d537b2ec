"""The checks of a ``lab`` submission, grouped by the invariant they pin, plus the checks of
``moco_warmup`` (shared with the ``components`` style).

Each check takes the evidence built by ``evidence.LabEvidence`` (or, for the warm-up
checks, anything with a ``warmup`` record), returns an optional note when the invariant
holds, and raises a ``CheckFailure`` (via ``assertions``) naming the misconception and the
evidence when it does not. Every number is recomputed from recorded tensors with the
reference; the invariant logic itself lives in ``invariants``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from moco_ref.core.contrastive import contrastive_logits
from moco_ref.core.warmup import WARMUP_KEYS, WARMUP_QUERY
from moco_ref.core.warmup import moco_warmup as reference_warmup
from moco_ref.judge.assertions import (
    NotExercised,
    SubmissionError,
    assert_close,
    at_step,
    fail,
    fmt_ids,
    fmt_range,
    fmt_values,
    require,
)
from moco_ref.judge.evidence import LabEvidence, describe_value
from moco_ref.judge.invariants import (
    REFERENCE_FORM,
    fifo_contents,
    form_gradient,
    form_logits,
    gradient_error,
    rotation_of,
)
from moco_ref.judge.invariants.loss import FORM_TEXT
from moco_ref.judge.registry import check

LAB = ("lab",)
BOTH = ("lab", "components")
LAB_AND_BUILDER = ("lab", "builder")  # checks that read only ``ev.ema`` (both evidences have it)
RETURN_NAMES = ("query", "key", "queue", "queue_ids", "history", "trace", "drift")
LAB_TRACE_KEYS = ("step", "queue_size", "first_source_id", "last_source_id")


# =========================================================================== contract


@check("contract-returns-seven-values", "train_moco returns LAB 07's seven values", "contract",
       1, LAB)
def check_returns_seven_values(ev: LabEvidence) -> str | None:
    """``train_moco(initial, x, train, epochs)`` returns ``(query, key, queue, queue_ids,
    history, trace, drift)``: two ``nn.Module`` encoders, the queue ``[n, 24]`` float oldest
    first, ``queue_ids`` ``[n]`` integer, ``history`` one number per epoch, ``trace`` a list
    of dicts, ``drift`` a number."""
    returned = ev.returned
    require(returned.get("length") == 7, "train_moco must return LAB 07's 7-tuple",
            expected="(query, key, queue, queue_ids, history, trace, drift)",
            got=f"a {returned.get('type')} of length {returned.get('length')}")
    items = returned["items"]
    for index in (0, 1):
        require(items[index].get("module", False), f"{RETURN_NAMES[index]} must be an nn.Module",
                expected="an nn.Module", got=f"a {items[index]['type']}")
    queue, ids = returned.get("queue"), returned.get("queue_ids")
    require(isinstance(queue, torch.Tensor) and queue.ndim == 2 and queue.is_floating_point(),
            "queue must be a [n, 24] float tensor", expected="a [n, 24] float tensor",
            got=describe_value(queue))
    d = ev.require_run()["projection_dim"]
    require(queue.shape[1] == d, "queue must be returned as [n, d], one key per row",
            expected=f"shape [n, {d}]",
            got=f"shape {list(queue.shape)}" + (" (dim-first: return queue.T)"
                                                  if queue.shape[0] == d else ""))
    require(isinstance(ids, torch.Tensor) and ids.ndim == 1 and not ids.is_floating_point()
            and ids.dtype != torch.bool,
            "queue_ids must be a [n] integer tensor", expected="a [n] int64 tensor",
            got=describe_value(ids))
    require(len(ids) == len(queue), "queue_ids must hold one id per queued key",
            expected=f"{len(queue)} ids", got=f"{len(ids)}")
    history = returned.get("history")
    require(isinstance(history, list) and all(isinstance(v, (int, float)) for v in history),
            "history must be a list of numbers (mean loss per epoch)",
            expected="a list of floats", got=describe_value(history))
    trace = returned.get("trace")
    require(isinstance(trace, list) and all(isinstance(v, dict) for v in trace),
            "trace must be a list of dicts", expected="a list of dicts", got=describe_value(trace))
    drift = returned.get("drift")
    require(isinstance(drift, (int, float)) and not isinstance(drift, bool),
            "drift must be a number", expected="a float", got=describe_value(drift))
    return None


@check("contract-batch-size", "batches have one size (the assignment's, if pinned)", "contract",
       1, LAB)
def check_batch_size(ev: LabEvidence) -> str | None:
    """Every epoch cuts the shuffled training ids into batches of one size (the last batch of
    an epoch may be smaller) and covers every training id once; when the assignment pins the
    batch size (``--expect-batch-size``) that is the size."""
    size = ev.batch_size
    train = set(ev.require_run()["train"].tolist())
    for epoch in range(ev.epochs_observed):
        steps = [s for s in ev.steps if s.epoch == epoch]
        sizes = [len(s.ids) for s in steps]
        require(all(n == size for n in sizes[:-1]) and sizes[-1] <= size,
                "batches of one epoch have different sizes", where=f"in epoch {epoch}",
                expected=f"batches of {size} (the last may be smaller)", got=f"sizes {sizes}")
        seen = [i for s in steps for i in s.ids.tolist()]
        if epoch < ev.epochs_observed - 1 or len(seen) == len(train):
            require(sorted(seen) == sorted(train), "an epoch does not visit every training image "
                    "exactly once", where=f"in epoch {epoch}",
                    expected=f"the {len(train)} ids of `train`, each once",
                    got=f"{len(seen)} ids, {len(set(seen))} distinct, "
                        f"{len(set(seen) - train)} not in `train`")
    pinned = ev.options.expect_batch_size
    if pinned is not None:
        require(size == pinned, "the batch size is not the assignment's", where="over the run",
                expected=f"batches of {pinned}", got=f"batches of {size}")
    return f"batch size {size}"


def _history(ev: LabEvidence) -> list:
    history = ev.returned.get("history")
    if not isinstance(history, list):
        fail("history must be a list of numbers (mean loss per epoch)", expected="a list",
             got=describe_value(history))
    return history


@check("contract-history-epoch-means", "history holds each epoch's mean loss", "contract", 1, LAB)
def check_history_epoch_means(ev: LabEvidence) -> str | None:
    """``history`` has one entry per epoch, the mean over that epoch's steps of the loss the
    step minimized, as recomputed from the recorded q, k and queue."""
    history = _history(ev)
    epochs = ev.probe.epochs
    require(len(history) == epochs, "history must hold one mean loss per epoch",
            expected=f"{epochs} values (the probe trains {epochs} epochs)",
            got=f"{len(history)}: {fmt_values(history)}")
    fit = ev.loss
    if fit.form.mask == "positive-too":
        return "values not compared: with the positive masked the loss is set by the mask constant"
    for epoch in range(epochs):
        losses = [fit.losses[s.index] for s in ev.steps if s.epoch == epoch]
        if not losses or any(v is None for v in losses):
            continue
        expected = sum(losses) / len(losses)
        got = history[epoch]
        if not math.isclose(got, expected, rel_tol=1e-4, abs_tol=1e-5):
            unrecognized = "" if fit.all_match else (
                " (the loss itself could not be recomputed: see I8-loss-matches-recomputation)")
            fail("history is not the mean loss of each epoch" + unrecognized,
                 where=f"for epoch {epoch} ({len(losses)} steps)",
                 expected=f"{expected:.6g} (mean of the recomputed step losses "
                          f"{fmt_values(losses, 4)})", got=f"{got:.6g}")
    return None


@check("contract-trace-matches-run", "trace describes the queue after the first steps", "contract",
       1, LAB)
def check_trace_matches_run(ev: LabEvidence) -> str | None:
    """``trace`` is a non-empty list of dicts for the first steps; when it uses LAB 07's keys
    (``step``, ``queue_size``, ``first_source_id``, ``last_source_id``) their values are the
    queue's after that step, as the submission's own queue rule produced it."""
    trace = ev.returned.get("trace")
    require(isinstance(trace, list) and len(trace) > 0 and all(isinstance(e, dict) for e in trace),
            "trace must be a non-empty list of dicts for the first steps",
            expected="[{'step': 0, 'queue_size': …, …}, …]", got=describe_value(trace)
            if not isinstance(trace, list) else f"{len(trace)} entries")
    require(len(trace) <= len(ev.steps), "trace has more entries than there were steps",
            expected=f"at most {len(ev.steps)}", got=len(trace))
    queue = ev.queue
    for index, entry in enumerate(trace):
        if not all(key in entry for key in LAB_TRACE_KEYS):
            continue
        positions, ids = queue.held_after(index + 1)
        expected = {"step": index, "queue_size": len(positions),
                    "first_source_id": int(ids[0]), "last_source_id": int(ids[-1])}
        got = {key: entry[key] for key in LAB_TRACE_KEYS}
        if got != expected:
            fail("trace does not describe the queue the run kept",
                 where=f"for trace entry {index} "
                       f"({at_step(index, ev.steps[index].ids, after=True)})",
                 expected=expected, got=got)
    return None


@check("contract-drift-recomputed", "drift is the change of the first query parameter",
       "contract", 1, LAB)
def check_drift_recomputed(ev: LabEvidence) -> str | None:
    """``drift`` is ‖θ − θ₀‖ for the first parameter of ``query.encoder``: its value after
    training minus its value in ``initial``, recomputed from the returned query encoder."""
    drift = ev.returned.get("drift")
    require(isinstance(drift, (int, float)) and not isinstance(drift, bool),
            "drift must be a number", expected="a float", got=describe_value(drift))
    final = ev.returned.get("query_params")
    if not isinstance(final, torch.Tensor):
        raise SubmissionError("train_moco returned no query encoder to recompute drift from")
    name, piece = next((n, s) for n, s in ev.segments if n.startswith("encoder."))
    initial = ev.require_run()["initial_params"]
    expected = float((final[piece].to(torch.float64) - initial[piece].to(torch.float64)).norm())
    require(math.isclose(drift, expected, rel_tol=1e-4, abs_tol=1e-6),
            "drift is not the norm of the change of query.encoder's first parameter",
            where=f"for {name}", expected=f"{expected:.6g}", got=f"{drift:.6g}")
    return None


# =========================================================================== I1


@check("I1-key-grads-none", "no key parameter ever receives .grad", "I1", 2, LAB)
def check_key_grads_none(ev: LabEvidence) -> str | None:
    """Every parameter of the key encoder has ``.grad is None`` throughout training and after
    it: the key encoder is moved only by the EMA, never by back-propagation."""
    run = ev.require_run()
    _, key_tag = ev.roles
    names = [n for n, _ in ev.segments]
    for step in ev.steps:
        event = run["events"][step.key_event]
        if key_tag in event["snapshot_tags"] and event["has_grad"][event["snapshot_tags"].index(
                key_tag)]:
            fail("the key encoder received gradients (keys computed with autograd, or the key "
                 "encoder is in the loss's graph)", where=at_step(step.index, step.ids),
                 expected="every key parameter's .grad to be None",
                 got=".grad set on the key encoder's parameters")
    grads_none = ev.returned.get("key_grads_none")
    if grads_none is None:
        raise SubmissionError("train_moco returned no key encoder to inspect")
    with_grad = [n for n, none in zip(names, grads_none) if not none]
    require(not with_grad, "the key encoder received gradients", where="after training",
            expected="every key parameter's .grad to be None",
            got=f".grad set on {', '.join(with_grad)}")
    return None


@check("I1-keys-without-autograd", "keys are computed without autograd", "I1", 1, LAB)
def check_keys_without_autograd(ev: LabEvidence) -> str | None:
    """The key encoder's output carries no autograd graph (``torch.no_grad()``, or frozen
    parameters and a detached input): no gradient can flow into θk."""
    for step in ev.steps:
        require(not step.key_has_grad_fn,
                "keys were computed with autograd: the key forward builds a graph into θk",
                where=at_step(step.index, step.ids),
                expected="a key projection without grad_fn (wrap the key forward in "
                         "torch.no_grad())",
                got="a key projection with grad_fn"
                    + (" (autograd was enabled)" if step.key_grad_enabled else ""))
    return None


# =========================================================================== I2

_KIND_TEXT = {
    "query": ("the queue holds queries, not keys",
              "the key k produced by the key encoder", "the query q of the same view batch"),
    "raw key": ("keys were enqueued without L2 normalization",
                "the normalized key k", "the raw, unnormalized key projection"),
    "recomputed key": ("old queue entries were recomputed with a later key encoder",
                       "the key as produced at its own step",
                       "the same image re-encoded at a later step"),
    "unknown": ("queue entries are not copies of the keys the key encoder produced",
                "a copy of a recorded key", "a vector that matches no recorded key"),
}


@check("I2-entries-are-arrival-keys", "each queue entry is the key produced at its own step",
       "I2", 2, LAB)
def check_entries_are_arrival_keys(ev: LabEvidence) -> str | None:
    """Every entry of the returned queue equals (to float tolerance) the normalized key the key
    encoder produced for that image at the step it was enqueued: entries are stored, not
    recomputed, and they are keys — not queries, not unnormalized projections."""
    queue = ev.queue
    wrong = [j for j, kind in enumerate(queue.kinds) if kind != "key"]
    if not wrong:
        return None
    kinds = [queue.kinds[j] for j in wrong]
    kind = max(set(kinds), key=kinds.count)
    j = next(j for j in wrong if queue.kinds[j] == kind)
    misconception, expected, got = _KIND_TEXT[kind]
    step, _ = queue.sources[j]
    where = f"queue entry {j} (id {int(queue.ids[j])}"
    where += f", enqueued at step {step})" if step >= 0 else ")"
    fail(misconception, where=f"{where}, {kinds.count(kind)} of {len(queue.kinds)} entries:",
         expected=expected, got=got)


@check("I2-negatives-not-recomputed", "the loss uses stored keys, not re-encoded ones", "I2", 1,
       LAB)
def check_negatives_not_recomputed(ev: LabEvidence) -> str | None:
    """The negatives of each step are the queue's stored keys; the key encoder is not run
    again on the queued images (that would make old keys move with θk, which MoCo's queue
    exists to avoid)."""
    fit = _judgeable_loss(ev, "whether the negatives were recomputed")
    if fit.form.negatives == "recomputed":
        step = next(s for s in ev.steps if s.recomputed is not None)
        fail("the queue was re-encoded with the current key encoder before the loss",
             where=at_step(step.index, step.ids),
             expected="negatives read from the stored queue",
             got=f"{len(step.recomputed[1])} queued images re-encoded by the key encoder and "
                 "used as negatives")
    return None


# =========================================================================== I3


def _positions_known(ev: LabEvidence) -> bool:
    return bool((ev.queue.positions >= 0).all())


def _final_where(ev: LabEvidence) -> str:
    last = ev.steps[-1]
    return at_step(last.index, last.ids, after=True)


@check("I3-fifo-keeps-newest", "the queue keeps the newest keys and drops the oldest", "I3", 2,
       LAB)
def check_fifo_keeps_newest(ev: LabEvidence) -> str | None:
    """After every enqueue the queue holds the last ``capacity`` keys in arrival order — the
    oldest are dropped first, also when a batch does not divide the capacity (the probe's
    queue wraps in the middle of a batch)."""
    queue = ev.queue
    expected_capacity = ev.options.expect_capacity
    if expected_capacity is not None:
        require(len(queue.keys) == min(expected_capacity, queue.total_arrivals),
                "the queue does not have the assignment's capacity", where=_final_where(ev),
                expected=f"{min(expected_capacity, queue.total_arrivals)} entries "
                         f"(capacity {expected_capacity})", got=f"{len(queue.keys)} entries")
    if queue.capacity is None:
        raise NotExercised(
            f"not exercised: the queue never dropped an entry ({queue.total_arrivals} keys "
            f"enqueued, {len(queue.keys)} kept), so its capacity is at least "
            f"{len(queue.keys)} and the FIFO rule was never put to work")
    capacity = queue.capacity
    if _positions_known(ev):
        expected = fifo_contents(queue.arrival_positions, capacity)[-1]
        got = queue.positions
        if sorted(got.tolist()) == sorted(expected.tolist()):
            return f"capacity {capacity}"
        kept_oldest = sorted(got.tolist()) == list(range(capacity))
        fail("queue kept the oldest keys" if kept_oldest else "queue did not keep the newest keys",
             where=_final_where(ev),
             expected=f"the last {capacity} keys (arrivals {fmt_range(expected)} of "
                      f"{queue.total_arrivals})",
             got=(f"the first {capacity} (arrivals {fmt_range(sorted(got.tolist()))})"
                  if kept_oldest else f"arrivals {fmt_ids(sorted(got.tolist()))}"))
    expected_ids = fifo_contents(queue.arrival_ids, capacity)[-1]
    require(sorted(queue.ids.tolist()) == sorted(expected_ids.tolist()),
            "queue did not keep the newest keys (judged by ids: its entries match no recorded key)",
            where=_final_where(ev), expected=f"ids {fmt_ids(expected_ids)}",
            got=f"ids {fmt_ids(queue.ids)}")
    return f"capacity {capacity}"


@check("I3-oldest-first-order", "the queue is returned oldest first", "I3", 1, LAB)
def check_oldest_first_order(ev: LabEvidence) -> str | None:
    """The queue lists its entries in arrival order, oldest first (a ring buffer is rotated to
    start at its oldest slot)."""
    queue = ev.queue
    if not _positions_known(ev):
        capacity = queue.capacity or queue.total_arrivals + 1
        expected_ids = fifo_contents(queue.arrival_ids, capacity)[-1]
        require(torch.equal(queue.ids, expected_ids) or
                sorted(queue.ids.tolist()) != sorted(expected_ids.tolist()),
                "queue is not oldest first (judged by ids)", where=_final_where(ev),
                expected=f"ids {fmt_ids(expected_ids)}", got=f"ids {fmt_ids(queue.ids)}")
        return None
    got = queue.positions
    ordered = got.sort().values
    if torch.equal(got, ordered):
        return None
    shift = rotation_of(got, ordered)
    if shift is not None:
        fail("the ring buffer was returned in storage order, not oldest first",
             where=_final_where(ev), expected=f"arrivals {fmt_range(ordered)} in order",
             got=f"the same entries rotated by {shift} (roll the buffer so the oldest slot "
                 "comes first)")
    newest_first = queue.key_rule == "newest-first"
    fail("queue is newest first" if newest_first else "queue entries are out of arrival order",
         where=_final_where(ev), expected=f"arrivals {fmt_range(ordered)}, oldest first",
         got=f"arrivals {fmt_ids(got)}" + (" (each new batch was put in front)"
                                           if newest_first else ""))


_ID_RULE_TEXT = {
    "fifo": "the last {}, oldest first",
    "keeps-oldest": "the first {} ever enqueued",
    "newest-first": "the last {}, newest first",
}


@check("I3-ids-move-with-keys", "each queued id is the source of its key", "I3", 2, LAB)
def check_ids_move_with_keys(ev: LabEvidence) -> str | None:
    """``queue_ids[j]`` is the source id of the image whose key is ``queue[j]``: ids are
    enqueued and dropped together with their keys."""
    queue = ev.queue
    if _positions_known(ev):
        flat = torch.cat(queue.arrival_ids)
        expected = flat[queue.positions]
    else:
        capacity = queue.capacity or queue.total_arrivals + 1
        expected = fifo_contents(queue.arrival_ids, capacity)[-1]
    if torch.equal(queue.ids, expected):
        return None
    same_shape = queue.ids.shape == expected.shape
    wrong = (queue.ids != expected).nonzero().flatten() if same_shape else None
    if wrong is None or not len(wrong):
        fail("queue_ids do not match the queue", where=_final_where(ev),
             expected=f"{len(expected)} ids", got=f"{len(queue.ids)}")
    j = int(wrong[0])
    rule = queue.id_rule
    hint = ""
    if rule in _ID_RULE_TEXT and queue.key_rule in _ID_RULE_TEXT and queue.key_rule != rule:
        hint = (f" (queue_ids kept {_ID_RULE_TEXT[rule].format(queue.capacity)} while the keys "
                f"kept {_ID_RULE_TEXT[queue.key_rule].format(queue.capacity)})")
    step, _ = queue.sources[j] if _positions_known(ev) else (-1, -1)
    fail("ids are out of step with their keys" + hint,
         where=f"queue entry {j}" + (f" (key enqueued at step {step})" if step >= 0 else "")
               + f", {len(wrong)} of {len(expected)} entries wrong:",
         expected=f"id {int(expected[j])}", got=f"queue_ids[{j}] = {int(queue.ids[j])}")


# =========================================================================== I4, I8, I9 helpers


def _judgeable_loss(ev: LabEvidence, what: str):
    fit = ev.loss
    if not fit.all_match:
        bad = next(i for i, ok in enumerate(fit.matched) if not ok)
        raise SubmissionError(
            f"cannot judge {what}: the loss could not be recomputed from the recorded q, k and "
            f"queue ({ev.step_where(bad)} differs from every known form; see "
            "I8-loss-matches-recomputation)")
    return fit


def _error_of(ev: LabEvidence, form, t: int, temperature: float | None = None) -> float:
    result = form_gradient(form, ev.loss_inputs[t], temperature or ev.options.temperature)
    return math.inf if result is None else gradient_error(ev.steps[t].grad, result[1])


def _evidence_step(ev: LabEvidence, fit, alternative, predicate=lambda t: True) -> int:
    """The first step where ``alternative`` is told apart from the identified form."""
    for t in range(len(ev.steps)):
        if predicate(t) and _error_of(ev, alternative, t, fit.temperature) > fit.tolerance:
            return t
    return 0


def _gradient_evidence(ev: LabEvidence, fit, alternative, t: int) -> str:
    return (f"(dL/dq matches it to {fit.errors[t]:.1e}; the expected form is off by "
            f"{_error_of(ev, alternative, t, fit.temperature):.1e})")


# =========================================================================== I4


@check("I4-same-source-masked", "negatives from the query's own image are masked", "I4", 2, LAB)
def check_same_source_masked(ev: LabEvidence) -> str | None:
    """A queue entry whose source id equals the query's id gets probability exactly 0 (masked
    with −inf or a large negative number); entries of other sources are never masked."""
    fit = _judgeable_loss(ev, "the same-source mask")
    colliding = [t for t in range(len(ev.steps))
                 if ev.collisions(t, fit.form.negatives if fit.form.negatives != "recomputed"
                                  else "before")]
    if not colliding:
        raise NotExercised("not exercised: no query met a queued key of its own image")
    if fit.form.mask != "none":
        return f"{sum(ev.collisions(t) for t in colliding)} same-source pairs masked"
    expected_form = replace(fit.form, mask="same-source")
    t = _evidence_step(ev, fit, expected_form, lambda s: s in colliding)
    mass = _same_source_mass(ev, fit, t)
    fail("same-source negatives were not masked", where=at_step(t, ev.steps[t].ids),
         expected=f"probability 0 for the {ev.collisions(t)} negatives from a query's own image",
         got=f"{mass:.3g} of each such query's probability on them, on average "
             + _gradient_evidence(ev, fit, expected_form, t))


def _same_source_mass(ev: LabEvidence, fit, t: int) -> float:
    step = ev.loss_inputs[t]
    keys, ids = step.negatives[fit.form.negatives]
    q, k = step.z.to(torch.float64), step.k.to(torch.float64)
    if fit.form.normalize != "q-raw":
        q = torch.nn.functional.normalize(q, dim=1)
    if fit.form.normalize != "k-raw":
        k = torch.nn.functional.normalize(k, dim=1)
    logits, _ = form_logits(fit.form, q, k, keys, ids, step.ids, fit.temperature)
    p = logits.softmax(dim=1)[:, 1:]  # [B, n]
    same = step.ids[:, None] == ids[None, :]
    rows = same.any(dim=1)
    return float((p * same).sum(dim=1)[rows].mean()) if rows.any() else 0.0


@check("I4-positive-never-masked", "the positive is never masked", "I4", 1, LAB)
def check_positive_never_masked(ev: LabEvidence) -> str | None:
    """Column 0, the positive ``q·k⁺/T``, is never masked, even though k⁺ comes from the
    query's own image."""
    fit = _judgeable_loss(ev, "the positive")
    if fit.form.mask != "positive-too":
        return None
    expected_form = replace(fit.form, mask="same-source")
    t = _evidence_step(ev, fit, expected_form, lambda s: len(ev.loss_inputs[s].negatives[
        fit.form.negatives][1]) > 0)
    fail("the positive was masked along with the same-source negatives (its id equals the "
         "query's)", where=at_step(t, ev.steps[t].ids),
         expected="the positive logit q·k⁺/T in column 0",
         got="column 0 masked: the loss is −ln 0 up to the mask constant and the gradient "
             "reaches q only through the negatives "
             + _gradient_evidence(ev, fit, expected_form, t))


# =========================================================================== I5, warmup


def _warmup_result(ev) -> dict:
    record = ev.warmup or {}
    if not record.get("defined", False):
        if getattr(ev, "style", "lab") == "components":
            raise NotExercised("moco_warmup is not defined (optional in the components protocol)")
        fail("moco_warmup is not defined", expected="a function moco_warmup() -> dict",
             got="no such name")
    if record.get("error"):
        raise SubmissionError("moco_warmup() raised:\n" + record["error"])
    result = record.get("result")
    require(isinstance(result, dict), "moco_warmup() must return a dict",
            expected="{'temperature_probabilities': …, 'FIFO': …, 'EMA': …}",
            got=describe_value(result))
    return result


def _warmup_entry(ev, key: str):
    result = _warmup_result(ev)
    require(key in result, f"moco_warmup() has no {key!r} entry",
            expected=f"keys {sorted(['temperature_probabilities', 'FIFO', 'EMA'])}",
            got=f"keys {sorted(result)}")
    return result[key]


def _numbers(value) -> list[float] | None:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                       for v in value):
        return [float(v) for v in value]
    return None


@check("warmup-returns-structure", "moco_warmup returns the documented dict", "warmup", 1, BOTH)
def check_warmup_structure(ev) -> str | None:
    """``moco_warmup()`` returns ``{'temperature_probabilities': {'0.1': [3 floats], '0.5':
    [3 floats]}, 'FIFO': [4 letters], 'EMA': [2 floats]}``."""
    result = _warmup_result(ev)
    probabilities = _warmup_entry(ev, "temperature_probabilities")
    require(isinstance(probabilities, dict) and sorted(probabilities) == ["0.1", "0.5"],
            "temperature_probabilities must map '0.1' and '0.5' to probabilities",
            expected="keys ['0.1', '0.5']", got=describe_value(probabilities)
            if not isinstance(probabilities, dict) else f"keys {sorted(probabilities)}")
    for t, values in probabilities.items():
        numbers = _numbers(values)
        require(numbers is not None and len(numbers) == 3,
                f"temperature_probabilities[{t!r}] must be 3 probabilities",
                expected="a list of 3 floats", got=describe_value(values))
    fifo = _warmup_entry(ev, "FIFO")
    require(isinstance(fifo, list) and all(isinstance(v, str) for v in fifo),
            "FIFO must be a list of letters", expected="a list of 4 strings",
            got=describe_value(fifo))
    ema = _numbers(_warmup_entry(ev, "EMA"))
    require(ema is not None and len(ema) == 2, "EMA must be a list of 2 numbers",
            expected="a list of 2 floats", got=describe_value(result.get("EMA")))
    return None


@check("I5-fifo-letters", "the warm-up FIFO keeps ['c', 'd', 'e', 'f']", "I5", 1, BOTH)
def check_warmup_fifo(ev) -> str | None:
    """A 4-slot queue holding a, b, c, d that receives e, f holds c, d, e, f (the reference's
    ``KeyQueue`` computes the expected letters)."""
    expected = reference_warmup()["FIFO"]
    got = _warmup_entry(ev, "FIFO")
    if got == expected:
        return None
    diagnosis = {
        ("a", "b", "c", "d"): "the warm-up queue kept the oldest letters",
        ("e", "f", "c", "d"): "the warm-up queue overwrote slots without rotating to oldest first",
        ("f", "e", "d", "c"): "the warm-up queue is newest first",
        ("e", "f", "a", "b"): "the warm-up queue put new letters in front",
        ("a", "b", "c", "d", "e", "f"): "the warm-up queue never dropped the oldest letters",
    }.get(tuple(got) if isinstance(got, list) else (), "the warm-up FIFO is wrong")
    fail(diagnosis, where="after enqueueing ['e', 'f'] into ['a', 'b', 'c', 'd'] with capacity 4",
         expected=expected, got=got)


@check("I5-ema-values", "the warm-up EMA gives [0.2, 2.2]", "I5", 1, BOTH)
def check_warmup_ema(ev) -> str | None:
    """θk = (0, 2) following θq = (2, 4) with m = 0.9 gives (0.2, 2.2) (the reference's
    ``momentum_update`` computes it)."""
    expected = reference_warmup()["EMA"]
    got = _numbers(_warmup_entry(ev, "EMA"))
    require(got is not None and len(got) == 2, "EMA must be a list of 2 numbers",
            expected=fmt_values(expected), got=describe_value(_warmup_entry(ev, "EMA")))
    if all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(got, expected)):
        return None
    diagnosis = "the warm-up EMA is wrong"
    for values, text in (([1.8, 3.8], "the EMA coefficients are swapped (0.1·θk + 0.9·θq)"),
                         ([0.0, 2.0], "the EMA did not move θk"),
                         ([2.0, 4.0], "the EMA copied θq (m = 0)")):
        if all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(got, values)):
            diagnosis = text
    fail(diagnosis, where="for θk = (0, 2), θq = (2, 4), m = 0.9", expected=fmt_values(expected),
         got=fmt_values(got))


def _warmup_probabilities(temperature: float, *, normalize: bool = True, multiply: bool = False):
    q = torch.tensor([WARMUP_QUERY], dtype=torch.float64)
    keys = torch.tensor(WARMUP_KEYS, dtype=torch.float64)
    if normalize:
        keys = torch.nn.functional.normalize(keys, dim=1)
    t = 1.0 / temperature if multiply else temperature
    return contrastive_logits(q, keys[:1], keys[1:], None, None, t).softmax(dim=1)[0].tolist()


@check("I5-temperature-probabilities", "the warm-up softmax over q·k/T is right for T = 0.1, 0.5",
       "I5", 1, BOTH)
def check_warmup_probabilities(ev) -> str | None:
    """For q = (1, 0) and the normalized keys (0.8, 0.2), (0, 1), (−1, 0), the probabilities
    are softmax(q·k/T) for T = 0.1 and T = 0.5 (recomputed with ``contrastive_logits``)."""
    probabilities = _warmup_entry(ev, "temperature_probabilities")
    require(isinstance(probabilities, dict), "temperature_probabilities must be a dict",
            expected="{'0.1': [...], '0.5': [...]}", got=describe_value(probabilities))
    expected_all = reference_warmup()["temperature_probabilities"]
    for t, expected in expected_all.items():
        require(t in probabilities, f"temperature_probabilities has no {t!r} entry",
                expected=f"keys {sorted(expected_all)}", got=f"keys {sorted(probabilities)}")
        got = _numbers(probabilities[t])
        if got is not None and len(got) == 3 and all(
                math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(got, expected)):
            continue
        diagnosis = f"the warm-up probabilities for T = {t} are wrong"
        if got is not None and len(got) == 3:
            for values, text in (
                (_warmup_probabilities(float(t), multiply=True),
                 "the scores were multiplied by T instead of divided"),
                (_warmup_probabilities(float(t), normalize=False),
                 "the keys were not L2-normalized"),
                (_warmup_probabilities(1.0), "the temperature was not applied"),
            ):
                if all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(got, values)):
                    diagnosis = f"{text} (T = {t})"
        fail(diagnosis, where=f"for T = {t}", expected=fmt_values(expected, digits=6),
             got=fmt_values(got, digits=6) if got is not None else describe_value(
                 probabilities[t]))
    return None


# =========================================================================== I6


@check("I6-key-starts-as-copy", "the key encoder starts as a copy of the query encoder", "I6", 1,
       LAB)
def check_key_starts_as_copy(ev: LabEvidence) -> str | None:
    """At the first key forward θk equals θq (a deep copy of ``initial``, up to LAB order's
    first EMA, a no-op up to rounding): both step orders agree only from θk = θq."""
    first = ev.steps[0]
    initial = ev.require_run()["initial_params"].to(torch.float64)
    assert_close(first.key_params, initial,
                 "the key encoder did not start as a copy of the query encoder",
                 rtol=1e-5, atol=1e-6,
                 where=f"{at_step(0, first.ids)}, θk vs initial's parameters:")
    return None


@check("I6-ema-uses-current-query", "the step order is the paper's or LAB 07's", "I6", 2,
       LAB_AND_BUILDER)
def check_ema_uses_current_query(ev: LabEvidence) -> str | None:
    """The key encoder that encodes step t's keys is m·θk + (1 − m)·θq with θq *after* step
    t − 1's optimizer step — true of both valid orders (paper: EMA after the query update;
    LAB 07 and the official module: EMA before the key forward). An EMA that uses θq from
    before the optimizer step (e.g. placed between the key forward and the update, or after
    the key forward inside ``forward``) is neither order."""
    ema = ev.ema
    if ema.uses == "none":
        raise NotExercised("not exercised: the key encoder never moved, so the place of the EMA "
                           "in the step cannot be observed (see I7)")
    if ema.uses == "stale" or ema.trailing == "stale":
        stale = [u for u in ema.updates if u.fits_stale and not u.fits_current] or ema.updates
        update = next((u for u in stale if u.residual_current > 0.05 and u.residual_stale < 0.05),
                      stale[0])
        fail("the EMA used the query parameters from before the optimizer step — an order that is "
             "neither the paper's (EMA after the update) nor LAB 07's (EMA before the key forward)",
             where=f"at step {update.step}" if not update.final else "after the last step",
             expected="θk = m·θk + (1 − m)·θq with θq after the previous update (residual "
                      f"{update.residual_current:.2g})",
             got=f"θk = m·θk + (1 − m)·θq with θq one update older (residual "
                 f"{update.residual_stale:.2g})")
    if ema.uses == "unknown":
        update = next((u for u in ema.updates if u.changed and not u.final), ema.updates[0])
        fail("no key update could be placed in either valid order", where=f"at step {update.step}",
             expected="θk = m·θk + (1 − m)·θq with θq current (paper or LAB order)",
             got=f"residuals {update.residual_current:.2g} (current θq) and "
                 f"{update.residual_stale:.2g} (θq one update older)")
    order = ema.order or "lab"
    note = {"lab": "observed order: LAB 07 / official (EMA before the key forward)",
            "paper": "observed order: paper (EMA after the query update)"}[order]
    return note + (" — updates too small to tell θq apart" if ema.uses == "ambiguous" else "")


# =========================================================================== I7


@check("I7-ema-law", "θk ← m·θk + (1 − m)·θq over all parameters, one m", "I7", 2,
       LAB_AND_BUILDER)
def check_ema_law(ev: LabEvidence) -> str | None:
    """Between two key forwards θk changes only by θk ← m·θk + (1 − m)·θq, over every
    parameter, with one m for the whole run (fitted from the snapshots): not by the
    optimizer, not on part of the model."""
    ema = ev.ema
    if ema.uses == "none":
        return None  # a frozen key encoder obeys the law with m = 1; I7-momentum-in-range says so
    m = ema.m
    for update in ema.updates:
        where = "after the last step" if update.final else f"between steps {update.step - 1} " \
                                                            f"and {update.step}"
        if update.skipped:
            fail("the EMA skipped some parameters", where=where,
                 expected=f"every parameter to follow θk ← m·θk + (1 − m)·θq (m = {m:.4g})",
                 got=f"{', '.join(update.skipped)} unchanged while θq moved (EMA over the "
                     "encoder only?)")
        if update.moved_outside:
            fail("the key encoder moved outside the EMA (is it updated by the optimizer?)",
                 where=where, expected="θk unchanged except by the EMA",
                 got="θk changed between the key forward and the EMA")
        if not update.fits_law:
            fail("the key update is not an EMA with the run's momentum", where=where,
                 expected=f"θk ← m·θk + (1 − m)·θq with m = {m:.4g}",
                 got=f"a change off by {min(update.residual_current, update.residual_stale):.2g} "
                     "of its size" if update.changed else "no change at all (no EMA this step)")
    return f"m = {m:.6g}"


@check("I7-momentum-in-range", "the momentum m is a slow EMA, 0.5 ≤ m < 1", "I7", 1, LAB)
def check_momentum_in_range(ev: LabEvidence) -> str | None:
    """The inferred m lies in [0.5, 1): the key encoder keeps most of its own value each step
    (m = 0 copies θq, m < 0.5 is an EMA with its coefficients swapped, m = 1 never moves).
    When the assignment pins m (``--expect-m``), m must match it."""
    ema = ev.ema
    m = ema.m
    if ema.uses == "none" or m is None:
        fail("the key encoder never moved", where="over the whole run",
             expected="θk ← m·θk + (1 − m)·θq with 0.5 ≤ m < 1", got="m = 1 (frozen key encoder)")
    pinned = ev.options.expect_m
    if pinned is not None:
        require(abs((1 - m) - (1 - pinned)) <= max(0.02 * (1 - pinned), 1e-6),
                "the momentum is not the assignment's", where="fitted over the run",
                expected=f"m = {pinned}", got=f"m = {m:.6g}")
        return f"m = {m:.6g}"
    require(m > 1e-6, "the key encoder copies the query encoder (m = 0): no momentum",
            where="fitted over the run", expected="0.5 ≤ m < 1 (LAB 07: 0.95)", got=f"m = {m:.3g}")
    require(m >= 0.5, "the EMA coefficients look swapped: θk ← (1 − m)·θk + m·θq",
            where="fitted over the run", expected="0.5 ≤ m < 1 (LAB 07: 0.95)",
            got=f"m = {m:.4g} (i.e. {1 - m:.4g} with the coefficients swapped)")
    require(m < 1 - 1e-9, "the key encoder never moved", where="fitted over the run",
            expected="0.5 ≤ m < 1", got=f"m = {m:.6g}")
    return f"m = {m:.6g}"


# =========================================================================== I8


@check("I8-loss-matches-recomputation", "the loss is −ln p⁺ as recomputed from q, k and the queue",
       "I8", 2, LAB)
def check_loss_matches_recomputation(ev: LabEvidence) -> str | None:
    """At every step the gradient of the submission's loss w.r.t. the query's projection equals
    that of a recomputed InfoNCE loss (−ln p⁺, mean over the batch) from the recorded q, k,
    the queue rebuilt from recorded keys, the ids and T. (Which ingredient differs from the
    reference is judged by the I4, I8 and I9 checks; this one fails only when no form fits.)"""
    fit = ev.loss
    if fit.all_match:
        return "matches " + fit.form.describe()
    t = next(i for i, ok in enumerate(fit.matched) if not ok)
    step = ev.steps[t]
    if step.grad is None:
        fail("no gradient of the loss reached the query encoder", where=at_step(t, step.ids),
             expected="loss.backward() through q = normalize(query(view)[1])", got="no gradient")
    result = form_gradient(REFERENCE_FORM, ev.loss_inputs[t], ev.options.temperature)
    hint = ""
    if result is not None:
        reference = result[1]
        scale = float((step.grad.to(torch.float64) * reference).sum() / (reference ** 2).sum())
        if abs(scale - len(step.ids)) < 0.01 * len(step.ids):
            hint = " (the loss looks summed over the batch instead of averaged)"
        elif abs(scale - 1) > 0.01 and gradient_error(step.grad, scale * reference) < fit.tolerance:
            hint = f" (the loss is the reference's times {scale:.4g})"
    fail("the loss is not one the grader can recompute" + hint, where=at_step(t, step.ids),
         expected=f"dL/dq of {fit.form.describe()} (T = {fit.temperature:g})",
         got=f"a gradient off by {fit.errors[t]:.2g} of its size (the reference loss: off by "
             f"{_error_of(ev, REFERENCE_FORM, t):.2g})")


@check("I8-temperature-divides-logits", "logits are divided by T", "I8", 1, LAB)
def check_temperature(ev: LabEvidence) -> str | None:
    """Every logit, the positive and the negatives alike, is a cosine similarity divided by the
    temperature T (0.2 unless the assignment sets ``--temperature``)."""
    fit = ev.loss
    t_expected = ev.options.temperature
    if fit.temperature_fitted:
        fail("the loss uses another temperature", where="fitted over every step",
             expected=f"T = {t_expected:g}",
             got=f"T = {fit.temperature:.4g} (if the assignment uses it, grade with "
                 f"--temperature {fit.temperature:.4g})")
    fit = _judgeable_loss(ev, "the temperature")
    for factor in ("temperature", "warmup_temperature"):
        rule = getattr(fit.form, factor)
        if rule == "divide":
            continue
        expected_form = replace(fit.form, **{factor: "divide"})
        t = _evidence_step(ev, fit, expected_form)
        fail(FORM_TEXT[(factor, rule)], where=at_step(t, ev.steps[t].ids),
             expected=f"logits q·k/T with T = {t_expected:g}",
             got=("logits q·k·T (as if T were " + f"{1 / t_expected:g})"
                  if rule == "multiply" else "the positive q·k⁺ not divided by T")
                 + " " + _gradient_evidence(ev, fit, expected_form, t))
    return None


@check("I8-embeddings-normalized", "q and k are L2-normalized", "I8", 1, LAB)
def check_embeddings_normalized(ev: LabEvidence) -> str | None:
    """The query and the key are L2-normalized projections, so every logit is a cosine
    similarity over T."""
    fit = _judgeable_loss(ev, "the normalization of q and k")
    if fit.form.normalize == "both":
        return None
    expected_form = replace(fit.form, normalize="both")
    t = _evidence_step(ev, fit, expected_form)
    which = "q" if fit.form.normalize == "q-raw" else "k"
    fail(f"{which} was not L2-normalized", where=at_step(t, ev.steps[t].ids),
         expected=f"{which} = F.normalize({'query' if which == 'q' else 'key'}(view)[1], dim=1)",
         got=f"the raw projection {_gradient_evidence(ev, fit, expected_form, t)}")


@check("I8-empty-queue-in-batch", "with an empty queue the first batch uses in-batch negatives",
       "I8", 1, LAB)
def check_empty_queue_in_batch(ev: LabEvidence) -> str | None:
    """While the queue is empty (the first step) the loss is the in-batch form: logits
    ``q·kᵀ/T`` ``[B, B]``, labels ``arange(B)`` — each query's positive is its own key and the
    batch's other keys are its negatives."""
    fit = _judgeable_loss(ev, "the first step's loss")
    step = ev.steps[0]
    expected_form = replace(fit.form, empty_queue="in-batch", negatives="before")
    error = _error_of(ev, expected_form, 0, fit.temperature)
    if error <= fit.tolerance:
        return None
    got = {
        "in-batch-zero-labels": "in-batch logits with labels all 0 (every query told that key 0 "
                                "is its positive)",
        "positive-only": "a loss of 0 and no gradient (no warm-up branch: each row had only its "
                         "positive)",
    }.get(fit.form.empty_queue, "another loss")
    fail("the first batch (empty queue) does not use in-batch negatives",
         where=at_step(0, step.ids), expected="logits q·kᵀ/T [B, B] with labels arange(B)",
         got=f"{got} (the in-batch form is off by {error:.2g})")


# =========================================================================== I9


@check("I9-batch-not-own-negative", "the current batch's keys are not its negatives", "I9", 2, LAB)
def check_batch_not_own_negative(ev: LabEvidence) -> str | None:
    """The loss of a batch uses the queue as it was *before* the batch: its keys are enqueued
    after the loss, so they are never negatives for their own batch."""
    fit = _judgeable_loss(ev, "which keys were negatives")
    if fit.form.negatives != "after":
        return None
    expected_form = replace(fit.form, negatives="before")
    t = _evidence_step(ev, fit, expected_form, lambda s: s > 0)
    before = len(ev.loss_inputs[t].negatives["before"][1])
    fail("the batch's own keys were negatives (enqueued before the loss)",
         where=at_step(t, ev.steps[t].ids),
         expected=f"negatives from the queue before this batch ({before} keys)",
         got=f"the queue after enqueueing this batch's {len(ev.steps[t].ids)} keys "
             + _gradient_evidence(ev, fit, expected_form, t))
