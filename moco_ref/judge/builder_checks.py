"""The checks of a ``builder`` submission (an official-style ``MoCo`` module), under the same
ids as the ``lab`` checks of the same invariants, plus the module's interface (``contract``).

The evidence is ``builder_evidence.BuilderEvidence``: the module built and trained by the
grader's probe, with every forward, buffer and parameter snapshot recorded. Expected values
come from the reference through ``invariants``: the FIFO from ``KeyQueue``
(``expected_fifo``), the logits from ``contrastive_logits`` (``expected_logits``), the EMA
from ``momentum_update`` (``analyse_key_updates``). The checks whose evidence reads the same
in both styles (``I6-ema-uses-current-query``, ``I7-ema-law``) are registered for ``builder``
in ``checks`` itself.

Not applicable to ``builder`` (the registry says why): the same-source mask (I4: no ids),
``queue_ids`` (I3-ids-move-with-keys), the warm-up values and ``moco_warmup`` (I5, warmup),
the empty-queue batch (the official queue starts full of random keys), ``train_moco``'s
return values.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from moco_ref.core.contrastive import positive_labels

# The lab checks register first: they fix each shared id's title, docstring and place.
from moco_ref.judge import lab_checks as checks  # noqa: F401
from moco_ref.judge.assertions import (
    SubmissionError,
    assert_close,
    at_step,
    fail,
    fmt_ids,
    fmt_range,
    fmt_values,
    require,
)
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.invariants import (
    describe_logits_form,
    expected_fifo,
    expected_logits,
    logits_error,
    oldest_first,
)
from moco_ref.judge.invariants.buffer import CHANGED, KEPT, UNKNOWN
from moco_ref.judge.invariants.logits import BUILDER_FORM
from moco_ref.judge.invariants.loss import FORM_TEXT
from moco_ref.judge.registry import check

BUILDER = ("builder",)


def _at(step: int, after: bool = False) -> str:
    return at_step(step, after=after)


# =========================================================================== contract


def _shape(info: dict) -> str:
    if "shape" in info:
        return f"a {info.get('dtype')} tensor of shape {info['shape']}"
    return f"a {info.get('type')}"


@check("contract-builder-interface", "MoCo has the official constructor, buffers and forward",
       "contract", 1, BUILDER)
def check_builder_interface(ev: BuilderEvidence) -> str | None:
    """``MoCo(base_encoder, dim, K, m, T, mlp)`` builds ``encoder_q`` and ``encoder_k`` with
    ``base_encoder(num_classes=dim)``, registers the buffers ``queue`` ``[dim, K]`` (float)
    and ``queue_ptr`` (one integer), and ``forward(im_q, im_k)`` returns ``(logits [B, 1 + K]
    float, labels [B] int64)``."""
    module, p = ev.module, ev.probe
    calls = module.get("factory_calls", [])
    require(bool(calls) and all(c["num_classes"] == p.dim for c in calls),
            "the encoders must be built by base_encoder(num_classes=dim)",
            expected=f"base_encoder(num_classes={p.dim})",
            got="no call" if not calls else f"num_classes {[c['num_classes'] for c in calls]}")
    for role in ("q", "k"):
        require(module.get(f"encoder_{role}", False), f"MoCo has no encoder_{role} module",
                expected=f"self.encoder_{role} = base_encoder(num_classes=dim)",
                got="no such nn.Module attribute")
    buffers = module.get("buffers", [])
    missing = [name for name in ("queue", "queue_ptr") if name not in buffers]
    require(not missing, "queue and queue_ptr must be registered buffers (register_buffer: they "
            "follow .cuda()/.to() and are saved in state_dict)",
            expected="buffers queue and queue_ptr", got=f"{', '.join(missing)} not registered")
    queue, ptr = module["queue"], module["queue_ptr"]
    require(queue.get("shape") == [p.dim, p.K] and queue.get("dtype", "").startswith(
        ("float", "bfloat")), "the queue buffer must be [dim, K], one key per column",
            expected=f"a float tensor of shape [{p.dim}, {p.K}]", got=_shape(queue))
    require(ptr.get("shape") in ([1], []) and ptr.get("dtype", "").startswith(("int", "uint")),
            "queue_ptr must hold one integer (the next column to overwrite)",
            expected="torch.zeros(1, dtype=torch.long)", got=_shape(ptr))
    step = ev.steps[0]
    require(list(step.logits.shape) == [p.batch, 1 + p.K],
            "forward must return logits [B, 1 + K]: the positive, then one column per queue entry",
            where=_at(0), expected=f"shape [{p.batch}, {1 + p.K}]",
            got=f"shape {list(step.logits.shape)}")
    labels = step.labels
    require(labels.shape == (p.batch,) and labels.dtype == torch.int64,
            "forward must return labels [B] int64 (the class index of the positive)",
            where=_at(0), expected=f"an int64 tensor of shape [{p.batch}]",
            got=f"a {str(labels.dtype).replace('torch.', '')} tensor of shape "
                f"{list(labels.shape)}")
    return None


@check("contract-builder-mlp", "mlp=True adds an MLP head to both encoders", "contract", 1,
       BUILDER)
def check_builder_mlp(ev: BuilderEvidence) -> str | None:
    """``MoCo(..., mlp=True)`` turns the last layer of both encoders into an MLP (MoCo v2:
    ``fc`` becomes Linear → ReLU → Linear, so there are more parameters than with
    ``mlp=False``), makes θk a copy of that θq, and trains like ``mlp=False``."""
    plain = ev.module
    run = ev.require_run("mlp")
    module = run.get("module", {})
    count = {name: sum(e["numel"] for e in info.get("layout_q", []))
             for name, info in (("plain", plain), ("mlp", module))}
    require(count["mlp"] > count["plain"], "mlp=True did not add a hidden layer to the encoders",
            expected=f"more than the {count['plain']} parameters of encoder_q with mlp=False",
            got=f"{count['mlp']} parameters")
    for role in ("q", "k"):
        kinds = module.get(f"fc_{role}", [])
        require("ReLU" in kinds and kinds.count("Linear") >= 2,
                f"with mlp=True encoder_{role}.fc must be an MLP (Linear → ReLU → Linear)",
                expected="fc = nn.Sequential(nn.Linear(w, w), nn.ReLU(), fc)",
                got=f"fc made of {kinds or 'nothing'}")
    require(module.get("layout_k") == module.get("layout_q"),
            "with mlp=True encoder_k does not have encoder_q's parameters",
            expected="the same head on both encoders",
            got=f"{len(module.get('layout_k', []))} vs {len(module.get('layout_q', []))} "
                "parameter tensors")
    first = run["steps"][0]
    key = next((e for e in first["events"] if e["role"] == "k"), None)
    if key is None:
        raise SubmissionError("with mlp=True encoder_k never ran in the first step")
    assert_close(key["params_k"], run["initial"]["params_q"],
                 "with mlp=True the key encoder did not start as a copy of the query encoder "
                 "(copy the parameters after adding the MLP head)", rtol=1e-5, atol=1e-6,
                 where="at the first key forward, θk vs θq as built:")
    require(list(first["logits"].shape) == [ev.probe.batch, 1 + ev.probe.K],
            "with mlp=True forward must still return logits [B, 1 + K]", where=_at(0),
            expected=f"shape [{ev.probe.batch}, {1 + ev.probe.K}]",
            got=f"shape {list(first['logits'].shape)}")
    return f"{count['mlp'] - count['plain']} head parameters added"


# =========================================================================== I1


@check("I1-key-grads-none", "no key parameter ever receives .grad", "I1", 2, BUILDER)
def check_key_grads_none(ev: BuilderEvidence) -> str | None:
    """After every ``loss.backward()`` of the official loop (cross-entropy of the returned
    logits), every parameter of ``encoder_k`` has ``.grad is None``: the key encoder is moved
    only by the EMA, never by back-propagation."""
    names = [entry["name"] for entry in ev.module.get("layout_k", [])]
    for step in ev.steps:
        with_grad = [name for name, has in zip(names, step.key_grads) if has]
        require(not with_grad, "the key encoder received gradients (the keys are in the loss's "
                "graph: no torch.no_grad() around the key forward, and θk still requires grad)",
                where=_at(step.index),
                expected="every encoder_k parameter's .grad to be None after loss.backward()",
                got=f".grad set on {', '.join(with_grad[:4])}"
                    + (f" and {len(with_grad) - 4} more" if len(with_grad) > 4 else ""))
    return None


@check("I1-keys-without-autograd", "keys are computed without autograd", "I1", 1, BUILDER)
def check_keys_without_autograd(ev: BuilderEvidence) -> str | None:
    """``encoder_k``'s output carries no autograd graph (``torch.no_grad()``, or frozen
    parameters): no gradient can flow into θk."""
    for step in ev.steps:
        require(not step.key_has_grad_fn,
                "keys were computed with autograd: the key forward builds a graph into θk",
                where=_at(step.index),
                expected="encoder_k's output without grad_fn (run it under torch.no_grad())",
                got="an output with grad_fn" + (" (autograd was enabled)"
                                                if step.key_grad_enabled else ""))
    return None


# =========================================================================== I2

_KIND_TEXT = {
    "query": ("the queue holds queries, not keys", "the query q of the same images"),
    "raw query": ("the queue holds unnormalized queries, not keys",
                  "the query encoder's raw output"),
    "raw key": ("keys were enqueued without L2 normalization",
                "the raw output of encoder_k (the logits' positive used the normalized key)"),
    "key": ("the queue holds normalized keys while the logits used the raw ones",
            "the normalized key"),
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
    return "raw key" if fit.all_match and fit.form.normalize == "k-raw" else "key"


@check("I2-entries-are-arrival-keys", "each queue entry is the key produced at its own step",
       "I2", 2, BUILDER)
def check_entries_are_arrival_keys(ev: BuilderEvidence) -> str | None:
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
        misconception, got = _KIND_TEXT[kind]
        fail(misconception, where=f"{_at(step.index)}, buffer columns "
                                  f"{fmt_ids([j for j in wrong if trace.kinds[j] == kind])}:",
             expected=f"the {ev.probe.batch} keys k = normalize(encoder_k(im_k))"
                      if expected_kind == "key" else "the keys as the logits used them",
             got=got)
    return None


@check("I2-negatives-not-recomputed", "the loss uses stored keys, not re-encoded ones", "I2", 1,
       BUILDER)
def check_columns_unchanged(ev: BuilderEvidence) -> str | None:
    """A queue column that survives a step keeps its exact bits: an entry keeps the value it
    had when enqueued (the negatives are stored keys, never rewritten or re-encoded)."""
    for step, trace in zip(ev.steps, ev.columns):
        changed = [j for j, kind in enumerate(trace.kinds) if kind == CHANGED]
        if changed:
            largest = float(trace.distance[changed].max())
            fail("old queue entries changed after they were enqueued",
                 where=f"{_at(step.index)}, buffer columns {fmt_ids(changed)}:",
                 expected="every surviving column bitwise equal to its value before the step",
                 got=f"{len(changed)} columns changed by up to {largest:.2g}")
    return None


# =========================================================================== I3


def _describe_labels(ev: BuilderEvidence, labels) -> str:
    """``keys of steps 0–1 (16), starting entries 16–47 (32)`` (labels as in ``buffer``)."""
    K, B = ev.probe.K, ev.probe.batch
    values = sorted(int(v) for v in labels)
    initial = [v for v in values if 0 <= v < K]
    steps = sorted({(v - K) // B for v in values if v >= K})
    parts = []
    if steps:
        count = sum(1 for v in values if v >= K)
        parts.append(f"keys of step{'s' if len(steps) > 1 else ''} {fmt_range(steps)} ({count})")
    if initial:
        parts.append(f"starting entries {fmt_range(initial)} ({len(initial)})")
    unknown = sum(1 for v in values if v < 0)
    if unknown:
        parts.append(f"{unknown} unknown")
    return ", ".join(parts) or "nothing"


def _describe_order(ev: BuilderEvidence, labels) -> str:
    """``keys of step 0 (8), then starting entries 8–47 (40)``: runs of one step's keys (or
    of starting entries) in the order given."""
    K, B = ev.probe.K, ev.probe.batch
    runs: list[list[int]] = []
    for value in (int(v) for v in labels):
        group = -1 if value < K else (value - K) // B
        if runs and (-1 if runs[-1][0] < K else (runs[-1][0] - K) // B) == group:
            runs[-1].append(value)
        else:
            runs.append([value])
    shown = ", then ".join(_describe_labels(ev, run) for run in runs[:4])
    return shown + (f", then {len(runs) - 4} more runs" if len(runs) > 4 else "")


def _traced(ev: BuilderEvidence, step) -> torch.Tensor:
    trace = ev.columns[step.index]
    unknown = [j for j, kind in enumerate(trace.kinds) if kind == UNKNOWN]
    if unknown:
        raise SubmissionError(
            f"{_at(step.index, after=True)} buffer columns {fmt_ids(unknown)} are copies of no "
            "recorded key, so the FIFO cannot be followed (see I2-entries-are-arrival-keys)")
    return trace.labels


def _pointer_text(step) -> str:
    return f"queue_ptr {step.ptr_before} → {step.ptr_after}"


@check("I3-fifo-keeps-newest", "the queue keeps the newest keys and drops the oldest", "I3", 2,
       BUILDER)
def check_fifo_keeps_newest(ev: BuilderEvidence) -> str | None:
    """After every step the buffer holds the last K entries in arrival order (the K it starts
    with count as the oldest): a step's keys overwrite the oldest columns, and no entry is
    dropped while an older one stays (the reference ``KeyQueue`` gives the expected set)."""
    K, B = ev.probe.K, ev.probe.batch
    for step in ev.steps:
        got = _traced(ev, step)
        expected = expected_fifo(K, B, step.index + 1)
        if sorted(got.tolist()) == sorted(expected.tolist()):
            continue
        dropped = sorted(set(expected.tolist()) - set(got.tolist()))
        kept = sorted(set(got.tolist()) - set(expected.tolist()))
        stuck = step.ptr_before is not None and step.ptr_before == step.ptr_after
        misconception = ("queue_ptr did not advance: every step overwrote the same columns"
                         if stuck else "the queue did not keep the newest keys")
        fail(misconception, where=f"{_at(step.index, after=True)} ({_pointer_text(step)})",
             expected=f"the last {K} entries: {_describe_labels(ev, expected)}",
             got=f"{_describe_labels(ev, dropped)} dropped while "
                 f"{_describe_labels(ev, kept)} stayed")
    return f"K = {K}, the queue wrapped {(len(ev.steps) * B) // K} time(s)"


@check("I3-oldest-first-order", "the queue is returned oldest first", "I3", 1, BUILDER)
def check_pointer_marks_oldest(ev: BuilderEvidence) -> str | None:
    """Read from ``queue_ptr`` on, the buffer lists its entries oldest first: the pointer
    advances by the batch size (mod K) and always marks the next column to overwrite, the
    oldest one."""
    K, B = ev.probe.K, ev.probe.batch
    for step in ev.steps:
        if step.ptr_after is None:
            raise SubmissionError("the module has no integer queue_ptr buffer to read the queue "
                                  "from")
        got = _traced(ev, step)
        expected = expected_fifo(K, B, step.index + 1)
        if sorted(got.tolist()) != sorted(expected.tolist()):
            continue  # which entries are held is I3-fifo-keeps-newest's business
        read = oldest_first(got, step.ptr_after % K)
        if torch.equal(read, expected):
            continue
        expected_ptr = None if step.ptr_before is None else (step.ptr_before + B) % K
        fail("queue_ptr does not mark the oldest column", where=f"{_at(step.index, after=True)} "
             f"({_pointer_text(step)})",
             expected=f"queue_ptr {expected_ptr} (advanced by the batch size {B} mod {K}), "
                      f"the buffer read from it oldest first: {_describe_order(ev, expected)}",
             got=f"read from queue_ptr {step.ptr_after}: {_describe_order(ev, read)}")
    return None


# =========================================================================== I6, I7


@check("I6-key-starts-as-copy", "the key encoder starts as a copy of the query encoder", "I6", 1,
       BUILDER)
def check_key_starts_as_copy(ev: BuilderEvidence) -> str | None:
    """At the first key forward θk equals θq as built: ``encoder_k`` starts as a copy of
    ``encoder_q`` (the official order's first EMA is then a no-op up to rounding)."""
    assert_close(ev.steps[0].key_params, ev.initial_query_params,
                 "the key encoder did not start as a copy of the query encoder",
                 rtol=1e-5, atol=1e-6, where="at step 0, θk at the key forward vs θq as built:")
    return None


def _close_momentum(fitted: float, expected: float) -> bool:
    return abs((1 - fitted) - (1 - expected)) <= max(0.02 * (1 - expected), 1e-6)


@check("I7-momentum-in-range", "the momentum m is a slow EMA, 0.5 ≤ m < 1", "I7", 1, BUILDER)
def check_momentum_is_m(ev: BuilderEvidence) -> str | None:
    """The m fitted from the key updates is the m the module was built with (``--expect-m``
    when pinned): the key encoder keeps m of itself each step (not 1 − m, not a hard-coded
    value, and it does move)."""
    ema, m = ev.ema, ev.momentum
    where = "fitted over every step"
    if ema.uses == "none" or ema.m is None:
        fail("the key encoder never moved (no EMA)", where=where,
             expected=f"θk ← m·θk + (1 − m)·θq with m = {m:g}", got="θk frozen (m = 1)")
    fitted = ema.m
    if _close_momentum(fitted, m):
        return f"m = {fitted:.6g}"
    attribute = ev.module.get("attributes", {}).get("m")
    if _close_momentum(fitted, 1 - m):
        misconception = "the EMA coefficients are swapped: θk ← (1 − m)·θk + m·θq"
    elif fitted <= 1e-6:
        misconception = "the key encoder copies the query encoder (m = 0): no momentum"
    elif attribute is not None and not math.isclose(attribute, m) and _close_momentum(
            fitted, attribute):
        misconception = f"the module ignores the m it was built with (self.m = {attribute:g})"
    else:
        misconception = "the EMA does not use the module's momentum"
    fail(misconception, where=where, expected=f"m = {m:g}", got=f"m = {fitted:.4g}")


# =========================================================================== I8, I9


def _judgeable_logits(ev: BuilderEvidence, what: str):
    fit = ev.logits
    if not fit.all_match:
        bad = next(i for i, ok in enumerate(fit.matched) if not ok)
        raise SubmissionError(
            f"cannot judge {what}: the logits could not be recomputed from the recorded q, k and "
            f"queue ({_at(bad)} differs from every known form; see "
            "I8-loss-matches-recomputation)")
    return fit


@check("I8-loss-matches-recomputation", "the loss is −ln p⁺ as recomputed from q, k and the queue",
       "I8", 2, BUILDER)
def check_logits_recomputed(ev: BuilderEvidence) -> str | None:
    """The returned logits are ``[q·k⁺, q·queue]/T`` (the reference's ``contrastive_logits``)
    recomputed from ``encoder_q``'s and ``encoder_k``'s recorded outputs and the queue buffer,
    up to the order of the negative columns, and the labels are ``zeros(B)`` (the positive is
    column 0), so the cross-entropy is −ln p⁺. (Which ingredient differs from the reference is
    judged by the other I8 checks and by I9; this one fails only when no known form fits or
    the labels are wrong.)"""
    fit = ev.logits
    if not fit.all_match:
        t = next(i for i, ok in enumerate(fit.matched) if not ok)
        step = ev.logit_steps[t]
        reference = expected_logits(BUILDER_FORM, step, ev.temperature)
        error = logits_error(step.logits, reference)
        fail("the logits are not ones the grader can recompute from q, k and the queue",
             where=f"{_at(t)}, row 0:",
             expected=f"[q·k⁺, q·queue]/T with T = {ev.temperature:g}: "
                      f"{fmt_values(reference[0], limit=4)}",
             got=f"{fmt_values(step.logits[0], limit=4)} of shape {list(step.logits.shape)} "
                 f"(off by {error:.2g} of the largest logit; the closest known form, "
                 f"{describe_logits_form(fit.form)}, off by {fit.errors[t]:.2g})")
    for step in ev.steps:
        zeros = positive_labels(len(step.labels))
        if torch.equal(step.labels.to(torch.int64), zeros):
            continue
        arange = torch.equal(step.labels.to(torch.int64), torch.arange(len(step.labels)))
        fail("the labels are arange(B): each query is told its positive is column i, but the "
             "positive is column 0" if arange else "the labels do not point at the positive "
             "(column 0)", where=_at(step.index), expected=f"labels {fmt_ids(zeros)} (zeros)",
             got=f"labels {fmt_ids(step.labels)}")
    return "matches " + describe_logits_form(fit.form)


@check("I8-temperature-divides-logits", "logits are divided by T", "I8", 1, BUILDER)
def check_temperature(ev: BuilderEvidence) -> str | None:
    """Every logit, the positive and the negatives alike, is a cosine similarity divided by
    the T the module was built with (``--temperature``; the module's ``self.T`` is only
    quoted, not trusted)."""
    fit, t = ev.logits, ev.temperature
    if fit.temperature_fitted and fit.all_match:
        fitted = fit.temperature
        attribute = ev.module.get("attributes", {}).get("T")
        if math.isclose(fitted, 1.0, rel_tol=1e-3):
            misconception = "the logits were not divided by the temperature"
        elif attribute is not None and not math.isclose(attribute, t) and math.isclose(
                fitted, attribute, rel_tol=1e-3):
            misconception = f"the module ignores the T it was built with (self.T = {attribute:g})"
        else:
            misconception = "the logits use another temperature"
        fail(misconception, where="fitted over every step", expected=f"logits q·k/T, T = {t:g}",
             got=f"q·k/T with T = {fitted:.4g}")
    fit = _judgeable_logits(ev, "the temperature")
    rule = fit.form.temperature
    if rule != "divide":
        fail(FORM_TEXT[("temperature", rule)], where=f"at every step (T = {t:g})",
             expected=f"logits q·k/T with T = {t:g}",
             got="logits q·k·T" if rule == "multiply" else "the positive q·k⁺ not divided by T")
    return None


@check("I8-embeddings-normalized", "q and k are L2-normalized", "I8", 1, BUILDER)
def check_embeddings_normalized(ev: BuilderEvidence) -> str | None:
    """The query and the key are L2-normalized encoder outputs, so every logit is a cosine
    similarity over T."""
    fit = _judgeable_logits(ev, "the normalization of q and k")
    if fit.form.normalize == "both":
        return None
    which = "q" if fit.form.normalize == "q-raw" else "k"
    step = ev.steps[0]
    raw = step.q if which == "q" else step.k
    fail(f"{which} was not L2-normalized", where=_at(0),
         expected=f"{which} = F.normalize(encoder_{which}(im_{which}), dim=1), of norm 1",
         got=f"the raw output, of norms {fmt_values(raw.norm(dim=1), limit=3)}")


@check("I9-batch-not-own-negative", "the current batch's keys are not its negatives", "I9", 2,
       BUILDER)
def check_batch_not_own_negative(ev: BuilderEvidence) -> str | None:
    """The logits of a step use the queue as it was *before* the step: the batch's keys are
    enqueued after the logits, so they are never negatives of their own batch."""
    fit = _judgeable_logits(ev, "which keys were negatives")
    if fit.form.negatives == "before":
        return None
    step = ev.steps[0]
    fail("the batch's own keys were negatives (enqueued before the logits were computed)",
         where=_at(0), expected=f"negatives from the queue before the step ({_pointer_text(step)})",
         got=f"the queue after enqueueing this batch's {ev.probe.batch} keys: each query's "
             "positive q·k⁺/T appears again among its negatives")
