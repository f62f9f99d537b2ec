"""From a ``builder`` observation record to the evidence the checks judge (grader's process).

The record (``builder_probe``) holds, per training step, the encoders' forwards in the order
they happened, the queue buffer and ``queue_ptr`` before and after the forward, the returned
logits and labels, and parameter snapshots. ``BuilderEvidence`` turns it into *steps* (the
query's and the key's raw outputs in image order, the parameters at the key forward, the
buffer's columns as ``[K, dim]`` rows) and then, lazily, into the three analyses the checks
read, each computed by ``invariants``:

- ``columns``: what every buffer column is a copy of after each step (I2, I3);
- ``ema``: the EMA fitted to the key-parameter snapshots: m, which θq, the order (I6, I7);
- ``logits``: the form of the returned logits: T, normalization, which queue (I8, I9).

Nothing the module says about itself is trusted: its ``T``/``m`` attributes are only named
in messages, every value is recomputed from recorded tensors.

Long on purpose: one reading of one module's runs (main, mlp, ragged), whose step views share
the traced forwards and the queue's arrival order; the two-process run is ``ranks_evidence``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import torch

from moco_ref.judge.assertions import NotJudged, SubmissionCrashed, SubmissionError, at_step
from moco_ref.judge.builder_record import (
    BUILDER_INTERFACE,
    pair_cross_entropies,
    recorded_pairs,
    recorded_pointer,
)
from moco_ref.judge.gaps import observed
from moco_ref.judge.invariants import (
    ColumnTrace,
    KeyUpdate,
    LogitsFit,
    StepLogits,
    analyse_key_updates,
    arrival_labels,
    describe_logits_form,
    identify_logits_form,
    initial_labels,
    trace_columns,
)
from moco_ref.judge.invariants.logits import (
    BUILDER_FORM,
    canonical_logits,
    expected_logits,
    logits_error,
    paired_as_used,
)
from moco_ref.judge.invariants.returned_loss import ReturnedLossFit, fit_returned_loss
from moco_ref.judge.ranks_evidence import RanksEvidence
from moco_ref.probe import schema
from moco_ref.probe.builder import (
    ENCODER_NAMES,
    IMAGE_SHAPE,
    KEY_VIEW,
    QUERY_VIEW,
    VIEW_NAMES,
    BuilderProbe,
    is_symmetric_run,
)
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import WHOLE

POLLUTED_FORM = replace(BUILDER_FORM, negatives="after")


def builder_where(step: int) -> str:
    return at_step(step)


ASYMMETRIC, SYMMETRIC = "asymmetric", "symmetric"
NEGATIVES_MATCH = 1e-3  # logits apart: the negatives of a half are q·queue/T as recorded


@dataclass
class BuilderStep:
    """One training step (one ``forward`` + backward + optimizer step) as observed."""

    index: int
    q: torch.Tensor  # [B, dim] float64 encoder_q's raw output, im_q row order
    k: torch.Tensor  # [B, dim] float64 encoder_k's raw output, im_k row order (unshuffled)
    key_grad_enabled: bool
    key_has_grad_fn: bool
    key_params: torch.Tensor  # [P] float64 θk at the key forward
    query_params: torch.Tensor  # [P] float64 θq at the key forward
    logits: torch.Tensor  # [B, 1 + K] float64 as returned
    labels: torch.Tensor  # [B] as returned
    queue_before: torch.Tensor | None  # [K, dim] float64, one row per buffer column
    queue_after: torch.Tensor | None  # [K, dim] after the forward
    ptr_before: int | None
    ptr_after: int | None
    key_grads: list[bool]  # per key parameter: .grad set after backward
    key_event: int  # index of the key forward among the step's forwards
    # a symmetric module: (query view, key view, logits [B, 1 + K]) of each half, in the order
    # the halves were computed; q, k, logits and labels are then both halves' rows stacked in
    # the order the module enqueues the views' keys
    halves: list[tuple[int, int, torch.Tensor]] = field(default_factory=list)
    views_q: dict[int, torch.Tensor] = field(default_factory=dict)  # view -> [B, dim]
    views_k: dict[int, torch.Tensor] = field(default_factory=dict)


def _as_float64(value) -> torch.Tensor:
    return value.to(torch.float64) if isinstance(value, torch.Tensor) else value


def error_line(error, limit: int = 200) -> str:
    """The last line of a run's recorded error: the exception, not the locals listed after."""
    text = str(error).split("\ntensors in ", 1)[0]
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:limit] if lines else "an error"


class BuilderEvidence:
    """Everything the ``builder`` checks judge, built from one observation record."""

    style = "builder"

    def __init__(self, observations: dict, options: GradeOptions) -> None:
        self.options = options
        self._observations = observations
        probe = observations.get("probe", {})
        self.probe = BuilderProbe.from_dict(probe if isinstance(probe, dict) else {})
        self.view_batch = self.probe.batch  # images per view and step
        self.warmup = {}
        self.variant = self._variant()
        self.pollution: dict[int, str] = {}  # symmetric: which halves a polluted queue reached
        if self.variant == SYMMETRIC:  # both views' keys arrive: 2B entries per step
            self.probe = replace(self.probe, batch=2 * self.view_batch)

    def _variant(self) -> str:
        """``"symmetric"`` when the main run's forward gave two (logits, labels) pairs (returned,
        or the two cross-entropies of a returned loss), else ``"asymmetric"``; a declared
        ``--variant`` that the module does not follow is named by contract-builder-interface."""
        try:
            run = self.record.get("run", {})
        except Exception:  # noqa: BLE001 - an unobserved record: its checks say so
            return ASYMMETRIC
        return SYMMETRIC if is_symmetric_run(run) else ASYMMETRIC

    @property
    def record(self) -> schema.BuilderRecord:
        """The whole record (a builder submission is observed in one part)."""
        return observed(self._observations.get(WHOLE, self._observations))

    def ragged(self) -> BuilderEvidence | None:
        """The evidence of the ragged run (K not a multiple of the batch) as if it were the
        main one; None when the module refused it by raising (a loud refusal) or it is absent."""
        run = self.record.get("ragged")
        if not isinstance(run, dict) or run.get("error") or not run.get("steps"):
            return None
        from moco_ref.probe.builder import ragged_probe

        record = {**self.record, "run": run,
                  "probe": ragged_probe(self.probe).to_dict()}
        return BuilderEvidence(record, self.options)

    def ragged_refusal(self) -> str | None:
        """The first line of the ragged run's error, when the module refused it."""
        run = self.record.get("ragged")
        if isinstance(run, dict) and run.get("error"):
            return error_line(run["error"])
        return None

    @cached_property
    def ranks(self) -> RanksEvidence:
        """The two-process run (its ``runs`` raise when it was not made or a rank raised)."""
        return RanksEvidence(self.record, self.probe, symmetric=self.variant == SYMMETRIC)

    # ----------------------------------------------------------------- runs

    def require_run(self, which: str = "run") -> schema.BuilderRun:
        """The training record (``"run"``, or ``"mlp"`` for the ``mlp=True`` run); raises
        ``SubmissionError`` with the submission's traceback when it failed."""
        if not self.record.get("defined", False) or self.record.get("error"):
            error = self.record.get("error") or ""
            raise SubmissionCrashed("module", "the module could not be loaded" if error
                                    else "MoCo is not defined", error)
        run = self.record.get(which) or {}
        if run.get("error"):
            p = self.probe
            extra = "".join(f", {name}={value!r}" for name, value in self.options.init_kwargs)
            call = (f"MoCo(base_encoder, dim={p.dim}, K={p.K}, m={p.m:g}, T={p.T:g}, "
                    f"mlp={run.get('mlp', False)}{extra})")
            stage = run.get("stage", "")
            if stage == "construct":
                summary = f"{call} raised"
            elif stage == "optimizer":
                summary = f"torch.optim.SGD(model.parameters()) raised for {call}"
            elif run.get("crashed_in") in ("q", "k"):
                summary = self._crash_in_encoder(call, stage, run["crashed_in"])
            else:
                summary = (f"{call} was built, but training it raised at {stage} (forward, "
                           "loss.backward() or optimizer.step())")
            raise SubmissionCrashed(which, summary, run["error"])
        return run

    def _crash_in_encoder(self, call: str, stage: str, role: str) -> str:
        """What a crash inside an encoder's forward leaves unreached, and why."""
        p = self.probe
        after = ("the EMA, the key encoder's forward, the shuffle and unshuffle of the keys, "
                 "the logits, the loss and the enqueue" if role == "q" else
                 "the unshuffle of the keys, the logits, the loss and the enqueue")
        return (f"{call} was built, but at {stage} encoder_{role}'s forward raised, inside the "
                f"module's own code, on the probe's {p.batch} images of shape "
                f"{list(IMAGE_SHAPE)} per view (the batch this course's probe draws): whatever "
                f"forward does after that call ({after}) was never reached, so none of it can be "
                "judged; a layer that needs a larger batch or larger images than the probe's "
                "hides the rest of the module")

    def constructed(self, which: str = "run") -> schema.BuilderRun:
        """The run's record when the module was built, even if training it then raised (so the
        construction can be judged on its own); otherwise ``require_run``'s error."""
        run = self.record.get(which) or {}
        if self.record.get("defined", False) and not self.record.get("error") and \
                "module" in run and run.get("initial") is not None:
            return run
        return self.require_run(which)

    @property
    def module(self) -> schema.BuilderModule:
        return self.constructed().get("module", {})

    @property
    def temperature(self) -> float:
        """The T the module was built with (``--temperature``)."""
        return self.probe.T

    @property
    def momentum(self) -> float:
        """The m the module was built with (``--expect-m`` when pinned)."""
        return self.probe.m

    # ----------------------------------------------------------------- buffer layout

    @cached_property
    def queue_layout(self) -> str:
        """``"dim-first"`` (the official ``[dim, K]``) or ``"rows"`` (``[K, dim]``)."""
        queue = self.require_run()["initial"].get("queue")
        p = self.probe
        if not isinstance(queue, torch.Tensor) or not queue.is_floating_point():
            raise NotJudged(BUILDER_INTERFACE,
                            f"the module has no float tensor `queue` (expected a buffer "
                            f"[dim, K] = [{p.dim}, {p.K}]); its queue is "
                            f"{self.module.get('queue')}")
        if list(queue.shape) == [p.dim, p.K]:
            return "dim-first"
        if list(queue.shape) == [p.K, p.dim]:
            return "rows"
        raise NotJudged(BUILDER_INTERFACE,
                        f"the module's queue has shape {list(queue.shape)}; built with "
                        f"dim={p.dim}, K={p.K} it must be [dim, K] = [{p.dim}, {p.K}]")

    def columns_of(self, queue) -> torch.Tensor | None:
        """The buffer as ``[K, dim]`` float64, one row per column of the official layout; None
        when there is none, or none of a layout the probe knows (the checks that need it say
        so, from ``queue_layout``; the others judge the encoders without it)."""
        if not isinstance(queue, torch.Tensor):
            return None
        try:
            layout = self.queue_layout
        except NotJudged:
            return None
        queue = queue.to(torch.float64)
        return queue.T if layout == "dim-first" else queue

    # ----------------------------------------------------------------- steps

    @cached_property
    def steps(self) -> list[BuilderStep]:
        run = self.require_run()
        steps = [self._step(t, record) for t, record in enumerate(run["steps"])]
        if not steps:
            raise SubmissionError("the module was built but no training step was recorded")
        return steps

    @cached_property
    def returned_loss(self) -> ReturnedLossFit | None:
        """When ``forward`` returns a loss of its own: how it relates to the cross-entropies
        of the logits the module made (``invariants.returned_loss``); None when it returns
        logits, which the probe's loop turns into the loss itself."""
        losses, cross_entropies = [], []
        for step in self.require_run()["steps"]:
            if not step.get("loss_returned") or not isinstance(step.get("loss"), float):
                return None
            try:
                cross_entropies.append(pair_cross_entropies(recorded_pairs(step)))
            except Exception:  # noqa: BLE001 - malformed logits: the logits checks name them
                return None
            losses.append(step["loss"])
        return fit_returned_loss(losses, cross_entropies) if losses else None

    @cached_property
    def key_from_query_view(self) -> int | None:
        """The first step of the main run where ``encoder_k`` ran on ``im_q`` and never on
        ``im_k`` (the key from the query's own view), or None."""
        for t, step in enumerate(self.require_run()["steps"]):
            keyed = {view for event in step["events"] if event["role"] == "k"
                     for view in set(event["views"].tolist())}
            if KEY_VIEW not in keyed and QUERY_VIEW in keyed:
                return t
        return None

    def _aligned(self, event: schema.BuilderForward, view: int, t: int, who: str) -> torch.Tensor:
        """The event's output rows of ``view`` put back in the order of the step's images (a
        forward may run on both views at once, ``encoder_q(torch.cat([im_q, im_k]))``: each
        view's rows are its own queries or keys)."""
        mine = event["views"] == view
        rows, output = event["rows"][mine], event["output"][mine]
        batch = self.view_batch
        if len(rows) != batch or sorted(rows.tolist()) != list(range(batch)):
            raise SubmissionError(
                f"at step {t} {who} did not run once on the {batch} images of "
                f"{'im_q' if view == QUERY_VIEW else 'im_k'}: the grader cannot pair queries "
                "with their keys")
        aligned = torch.empty_like(output, dtype=torch.float64)
        aligned[rows] = output.to(torch.float64)
        return aligned

    @staticmethod
    def _on_view(event: schema.BuilderForward, role: str, view: int) -> bool:
        """Whether the event is ``role``'s forward on rows of ``view`` (and of no image that
        is not one of the step's two views)."""
        views = event["views"]
        return (event["role"] == role and bool((views == view).any())
                and bool(((views == QUERY_VIEW) | (views == KEY_VIEW)).all()))

    def _step(self, t: int, record: schema.BuilderStep) -> BuilderStep:
        events = record["events"]
        queries = [i for i, e in enumerate(events) if self._on_view(e, "q", QUERY_VIEW)]
        keys = [i for i, e in enumerate(events) if self._on_view(e, "k", KEY_VIEW)]
        if not queries:
            raise SubmissionError(f"at step {t} encoder_q never ran on im_q (forwards seen: "
                                  f"{[e['role'] for e in events]})")
        key_view = KEY_VIEW
        if not keys and self.variant != SYMMETRIC:  # the key from the query's own view: the
            keys = [i for i, e in enumerate(events)  # pairing holds row by row, and
                    if self._on_view(e, "k", QUERY_VIEW)]  # I8-key-from-other-view names it
            key_view = QUERY_VIEW
        if not keys:
            raise SubmissionError(f"at step {t} encoder_k never ran on im_k (forwards seen: "
                                  f"{[e['role'] for e in events]})")
        query, key = events[queries[0]], events[keys[-1]]
        before, after = record["before"], record["after_forward"]
        shared = {
            "index": t,
            "key_grad_enabled": bool(key["grad_enabled"]),
            "key_has_grad_fn": bool(key["has_grad_fn"]),
            "key_params": _as_float64(key["params_k"]),
            "query_params": _as_float64(key["params_q"]),
            "queue_before": self.columns_of(before.get("queue")),
            "queue_after": self.columns_of(after.get("queue")),
            "ptr_before": recorded_pointer(before.get("queue_ptr")),
            "ptr_after": recorded_pointer(after.get("queue_ptr")),
            "key_grads": list(record.get("key_grads", [])),
            "key_event": keys[-1],
        }
        if self.variant == SYMMETRIC:
            return BuilderStep(**shared, **self._symmetric_parts(t, record))
        return BuilderStep(
            **shared,
            q=self._aligned(query, QUERY_VIEW, t, "encoder_q"),
            k=self._aligned(key, key_view, t, "encoder_k"),
            logits=record["logits"].to(torch.float64),
            labels=record["labels"],
        )

    def _symmetric_parts(self, t: int, record: schema.BuilderStep) -> dict:
        """What a symmetric step has of its own: each view's query and key, each returned pair
        matched to the (query view, key view) whose positives it holds, both halves' rows
        stacked in the order the module enqueues the views' keys."""
        events = record["events"]
        views_q, views_k = {}, {}
        for view in (QUERY_VIEW, KEY_VIEW):
            for role, found in (("q", views_q), ("k", views_k)):
                which = [e for e in events if self._on_view(e, role, view)]
                if not which:
                    raise SubmissionError(
                        f"at step {t} a symmetric module's encoder_{role} never ran on "
                        f"{VIEW_NAMES[view]} (both views are queries and keys)")
                found[view] = self._aligned(which[0 if role == "q" else -1], view, t,
                                            f"encoder_{role}")
        pairs = [pair["logits"].to(torch.float64) for pair in record.get("pairs") or []]
        if len(pairs) != 2:
            raise SubmissionError(f"at step {t} a symmetric module gave {len(pairs)} pairs")
        first = self._first_query_view(pairs, views_q, views_k,
                                       self.columns_of(record["before"].get("queue")))
        halves = [(first, 1 - first, pairs[0]), (1 - first, first, pairs[1])]
        order = self.enqueue_order
        labels = [pair["labels"] for pair in record["pairs"]]
        return {
            "q": torch.cat([views_q[v] for v in order]),
            "k": torch.cat([views_k[v] for v in order]),
            "logits": torch.cat([h[2] for h in halves]),
            "labels": torch.cat(labels) if all(y.ndim == 1 for y in labels) else labels[0],
            "halves": halves,
            "views_q": views_q,
            "views_k": views_k,
        }

    def _first_query_view(self, pairs: list, views_q: dict, views_k: dict,
                          queue: torch.Tensor | None) -> int:
        """The view whose queries the first pair holds: the assignment of the two pairs to
        (im_q against im_k's key, im_k against im_q's key) whose positive logits ``q·k/T`` are
        closest; when both fit alike (at the first step the key encoder is still a copy of
        the query encoder, so both halves have the same positives), the one whose negatives
        are closest to ``q·queue/T`` with the queue before the step (``[K, dim]``); else
        im_q."""
        normalize = torch.nn.functional.normalize

        def error(logits: torch.Tensor, query_view: int) -> float:
            q = normalize(views_q[query_view], dim=1)
            k = normalize(views_k[1 - query_view], dim=1)
            expected = (q * k).sum(dim=1) / self.temperature
            if logits.ndim != 2 or len(logits) != len(expected):
                return float("inf")
            return float((logits[:, 0] - expected).abs().max())

        def negatives_error(logits: torch.Tensor, query_view: int) -> float:
            """Each row's negatives (in the canonical order: their column order is the
            module's) against the query's similarities to the queue before the step."""
            q, columns = views_q[query_view], normalize(queue, dim=1)
            expected = expected_logits(BUILDER_FORM, StepLogits(
                q, q, logits, {"before": columns, "after": columns}), self.temperature)
            if logits.shape != expected.shape:
                return float("inf")
            return float((canonical_logits(logits) - canonical_logits(expected))[:, 1:]
                         .abs().max())

        straight = error(pairs[0], QUERY_VIEW) + error(pairs[1], KEY_VIEW)
        swapped = error(pairs[0], KEY_VIEW) + error(pairs[1], QUERY_VIEW)
        if abs(swapped - straight) <= 1e-6 and queue is not None:  # positives tie: negatives
            straight = negatives_error(pairs[0], QUERY_VIEW) + negatives_error(pairs[1], KEY_VIEW)
            swapped = negatives_error(pairs[0], KEY_VIEW) + negatives_error(pairs[1], QUERY_VIEW)
            if min(straight, swapped) > NEGATIVES_MATCH:  # other negatives (a polluted queue):
                return QUERY_VIEW  # they tell nothing; the first pair is read as im_q's
        return KEY_VIEW if swapped < straight - 1e-6 else QUERY_VIEW

    @cached_property
    def enqueue_order(self) -> tuple[int, int]:
        """The order a symmetric module enqueues the two views' keys in, read at the first
        step's pointer: ``(0, 1)`` (im_q's keys first, as the official symmetric code) unless
        the column there holds a key of im_k."""
        record = self.require_run()["steps"][0]
        columns = self.columns_of(record["after_forward"].get("queue"))
        ptr = recorded_pointer(record["before"].get("queue_ptr")) or 0
        events = record["events"]
        first = [e for e in events if self._on_view(e, "k", KEY_VIEW)]
        if columns is None or not first or not 0 <= ptr < len(columns):
            return (QUERY_VIEW, KEY_VIEW)
        key = self._aligned(first[-1], KEY_VIEW, 0, "encoder_k")[0]
        written = columns[ptr]
        normalize = torch.nn.functional.normalize
        if torch.allclose(written, normalize(key, dim=0), atol=1e-5) or torch.allclose(
                written, key, atol=1e-5):
            return (KEY_VIEW, QUERY_VIEW)
        return (QUERY_VIEW, KEY_VIEW)

    def logit_where(self, i: int) -> str:
        """Where the ``i``-th entry of ``logit_steps`` is: a step, or one half of it."""
        if self.variant != SYMMETRIC:
            return builder_where(i)
        step = self.steps[i // 2]
        query_view, key_view, _ = step.halves[i % 2]
        return (f"{builder_where(step.index)} ({'first' if i % 2 == 0 else 'second'} half: "
                f"q of {VIEW_NAMES[query_view]} against the key of {VIEW_NAMES[key_view]})")

    @property
    def initial_query_params(self) -> torch.Tensor:
        return _as_float64(self.require_run()["initial"]["params_q"])

    # ----------------------------------------------------------------- I2, I3

    def arrivals(self, step: BuilderStep) -> dict[str, torch.Tensor]:
        """The vectors a column written at ``step`` may be a copy of, by kind ``[B, dim]``."""
        normalize = torch.nn.functional.normalize
        return {"key": normalize(step.k, dim=1), "raw key": step.k,
                "batch-normalized key": normalize(step.k, dim=0),
                "query": normalize(step.q, dim=1), "raw query": step.q}

    @cached_property
    def columns(self) -> list[ColumnTrace]:
        """What each buffer column is a copy of after each step (labels as in ``buffer``)."""
        p = self.probe
        first = self.steps[0]
        if first.queue_before is None:
            _ = self.queue_layout  # raises NotJudged with the buffer's own shape, if it has one
            raise NotJudged(BUILDER_INTERFACE, "the module has no queue buffer to follow")
        labels = initial_labels(p.K, (first.ptr_before or 0) % p.K)  # no pointer: from 0
        traces = []
        for step in self.steps:
            if step.queue_before is None or step.queue_after is None:
                raise NotJudged(BUILDER_INTERFACE,
                                f"at step {step.index} the module had no queue buffer")
            trace = trace_columns(step.queue_before, labels, step.queue_after,
                                  self.arrivals(step), arrival_labels(p.K, p.batch, step.index))
            traces.append(trace)
            labels = trace.labels
        return traces

    # ----------------------------------------------------------------- I6, I7

    @cached_property
    def segments(self) -> list[tuple[str, slice]]:
        layout = self.module.get("layout_q") or []
        segments, start = [], 0
        for entry in layout:
            segments.append((entry["name"], slice(start, start + int(entry["numel"]))))
            start += int(entry["numel"])
        if self.module.get("layout_k") != layout:
            raise SubmissionError("encoder_q and encoder_k do not have the same parameters, so "
                                  "the key encoder cannot follow the query encoder by EMA")
        return segments

    def _key_snapshots_between(self, t: int) -> list[torch.Tensor]:
        """θk snapshots from the key forward of step t − 1 to that of step t, in time order
        (both ends excluded)."""
        records = self.require_run()["steps"]
        previous, now = records[t - 1], records[t]
        snapshots = [e["params_k"] for e in previous["events"][self.steps[t - 1].key_event + 1:]]
        snapshots += [previous["after_forward"]["params_k"], previous["after_step"]["params_k"],
                      now["before"]["params_k"]]
        snapshots += [e["params_k"] for e in now["events"][: self.steps[t].key_event]]
        return [_as_float64(s) for s in snapshots if isinstance(s, torch.Tensor)]

    @cached_property
    def ema(self):
        steps = self.steps
        updates = []
        for t in range(1, len(steps)):
            previous, now = steps[t - 1], steps[t]
            before = previous.key_params
            for snapshot in reversed(self._key_snapshots_between(t)):
                if not torch.equal(snapshot, now.key_params):
                    before = snapshot
                    break
            updates.append(KeyUpdate(t, previous.key_params, before, now.key_params,
                                     now.query_params, previous.query_params))
        return analyse_key_updates(updates, self.segments)

    # ----------------------------------------------------------------- I8, I9

    @cached_property
    def logit_steps(self) -> list[StepLogits]:
        steps = []
        for step in self.steps:
            if step.queue_before is None or step.queue_after is None:
                raise NotJudged(BUILDER_INTERFACE,
                                f"at step {step.index} the module had no queue buffer")
            if self.variant == SYMMETRIC:
                steps += self._half_logits(step)
                continue
            steps.append(StepLogits(step.q, step.k, step.logits,
                                    {"before": step.queue_before, "after": step.queue_after}))
        return steps

    def _half_logits(self, step: BuilderStep) -> list[StepLogits]:
        """Both halves of a symmetric step. "before" is the queue before the step for both.
        "after" is the queue a polluting module would have used, whichever of its two shapes
        explains the half's logits better: both views' keys enqueued before both halves (the
        buffer after the step), or — for the second half — the first half's keys enqueued
        between the halves (for the first half the other shape is the queue before the step:
        nothing of this step precedes it). Either pollution is then the "negatives after"
        form, named by I9; ``pollution`` records which one each step's halves fit."""
        K, B = self.probe.K, self.view_batch
        (q0, k0, logits0), (q1, k1, logits1) = step.halves
        middle = step.queue_before.clone()
        start = (step.ptr_before or 0) % K
        middle[[(start + i) % K for i in range(B)]] = torch.nn.functional.normalize(
            step.views_k[k0], dim=1)
        halves = []
        for (q, k, logits), polluted in (((q0, k0, logits0), step.queue_before),
                                         ((q1, k1, logits1), middle)):
            options = [StepLogits(step.views_q[q], step.views_k[k], logits,
                                  {"before": step.queue_before, "after": after})
                       for after in (polluted, step.queue_after)]
            errors = [logits_error(o.logits, expected_logits(POLLUTED_FORM, o, self.temperature))
                      for o in options]
            halves.append(options[int(errors[1] < errors[0])])
        self.pollution[step.index] = ("both halves" if halves[0].negatives["after"] is
                                      step.queue_after else "second half")
        return halves

    @cached_property
    def logits(self) -> LogitsFit:
        return identify_logits_form(self.logit_steps, self.temperature)

    @cached_property
    def judged_logits(self) -> LogitsFit:
        """``logits``; or, when that leaves steps unexplained because queries were paired with
        other images' keys (I8-loss-matches-recomputation names it), the fit of the keys as
        the logits paired them — what the temperature, the normalization and the negatives
        are judged on, so one wrong pairing is charged once."""
        fit = self.logits
        if fit.all_match:
            return fit
        paired = paired_as_used(self.logit_steps, self.temperature)
        if paired is None:
            return fit
        refit = identify_logits_form(paired, self.temperature)
        return refit if refit.all_match else fit

    # ----------------------------------------------------------------- report

    def _extra_encoder_arguments(self) -> str | None:
        """Keyword arguments beyond ``num_classes`` the module passed to ``base_encoder`` (the
        probe ignores them; with a real encoder, ``pretrained=True`` would start MoCo from
        supervised weights)."""
        calls = self.module.get("factory_calls", [])
        extra = sorted({name for call in calls for name in call.get("kwargs", [])})
        if not extra:
            raise LookupError("none")  # left out of the report
        return ", ".join(extra) + " (ignored by the probe)"

    def _variant_text(self) -> str:
        if self.variant != SYMMETRIC:
            return "asymmetric (one (logits, labels) pair)"
        record = self.require_run()["steps"][0]
        pairs, logits = record.get("pairs") or [], record.get("logits")
        stacked = len(pairs) == 2 and isinstance(logits, torch.Tensor) and len(logits) == sum(
            len(pair["logits"]) for pair in pairs)
        if stacked:
            how = (f"one [{len(logits)}, 1 + K] logits stacking both directions, read as its "
                   f"two halves{'; a loss of it returned' if record.get('loss_returned') else ''}")
        else:
            how = ("a loss; its two cross-entropies observed" if record.get("loss_returned")
                   else "two (logits, labels) pairs")
        first = " then ".join(VIEW_NAMES[v] for v in self.enqueue_order)
        return f"symmetric ({how}; keys enqueued {first})"

    def _encoder_names_text(self) -> str:
        """How the module names its encoders when not encoder_q and encoder_k (else raises)."""
        query, key = self.module.get("encoder_names") or ENCODER_NAMES[0]
        if (query, key) == ENCODER_NAMES[0]:
            raise LookupError("the official names")
        return f"{query} (followed as encoder_q) and {key} (as encoder_k)"

    def inferred(self) -> dict:
        """Values inferred from the trace, for the report (best effort, never raises)."""
        p = self.probe
        found: dict = {"dim": p.dim, "K": p.K, "batch_size": p.batch}
        for name, getter in (
            ("steps", lambda: len(self.steps)),
            ("m", lambda: None if self.ema.m is None else round(self.ema.m, 6)),
            ("order", lambda: {"lab": "official (EMA in forward, before the key forward)"}.get(
                self.ema.order, self.ema.order)),
            ("temperature", lambda: self.judged_logits.temperature),
            ("logits_form", lambda: describe_logits_form(self.judged_logits.form)),
            ("module_T", lambda: self.module.get("attributes", {}).get("T")),
            ("queue_layout", lambda: self.queue_layout),
            ("process_group", lambda: self.record.get("environment", {}).get("process_group")),
            ("variant", self._variant_text),
            ("base_encoder_extra_arguments", self._extra_encoder_arguments),
            ("encoders", self._encoder_names_text),
        ):
            try:
                found[name] = getter()
            except Exception:  # noqa: BLE001 - a missing value is reported by its check
                continue
        return found
