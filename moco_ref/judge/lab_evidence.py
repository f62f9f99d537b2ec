"""From a ``lab`` observation record to the evidence the checks judge (grader's process).

The record is raw: forwards in the order they happened, ``views`` calls, snapshots, what
``train_moco`` returned. ``LabEvidence`` turns it into *steps* (one per batch: its source
ids, the query's raw projection and the gradient the loss sent into it, the key's raw
projection, the parameters of both encoders at the key forward) and then, lazily, into the
three analyses the invariants need, each computed by ``invariants``:

- ``queue``: what every entry of the returned queue is a copy of, the rule it was kept by,
  the capacity, and the dictionary every step's loss must have used (I2, I3);
- ``ema``: the EMA fitted to the key-parameter snapshots: m, which θq, the order (I6, I7);
- ``loss``: the loss form that explains the observed gradients step by step (I4, I8, I9).

Nothing here trusts what the submission says about itself: every value is recomputed from
recorded tensors.

Long on purpose: ``LabEvidence`` is one reading of one run — following the steps, the queue,
the EMA and the loss inputs out of the same recorded forwards — and each of its cached views
builds on the others; split, they would pass the same half-built state around.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import torch
import torch.nn.functional as F

from moco_ref.core.contrastive import same_source_mask
from moco_ref.judge.assertions import (
    NotExercised,
    NotJudged,
    SubmissionCrashed,
    SubmissionError,
    describe_value,
    fail,
    fmt_ids,
)
from moco_ref.judge.gaps import observed
from moco_ref.judge.id_views import EpochOrders
from moco_ref.judge.invariants import (
    QUEUE_RULES,
    KeyUpdate,
    StepLossInputs,
    analyse_key_updates,
    arrival_numbers,
    identify_loss_form,
    identify_queue_rule,
    match_rows,
    queue_contents,
    through_one_buffer,
)
from moco_ref.judge.invariants.loss_diagnosis import LossDiagnosis, diagnose_loss
from moco_ref.judge.key_order import PositiveOrder, find_positive_order, shuffle_of
from moco_ref.probe import schema
from moco_ref.probe.cases import LabProbe
from moco_ref.probe.options import GradeOptions

MATCH_ATOL = 1e-5  # a queue entry is a copy of a recorded vector within this max-abs distance
# What a queue may store of each arrival; all but "query" are the key, normalized or not as
# I8 judges ("rescaled key": normalized with another norm than L2, "batch-normalized key":
# each feature normalized over the batch, dim=0, instead of each key over its features).
STORED_KINDS = ("key", "query", "raw key", "rescaled key", "batch-normalized key")
NORMS_NAMED = (1.0, 3.0, 4.0, float("inf"))  # the other p a key may have been normalized with


def _normalized_p(rows: torch.Tensor, p: float) -> torch.Tensor:
    """``rows`` ``[n, d]`` each divided by its p-norm."""
    return rows / torch.linalg.vector_norm(rows, ord=p, dim=1, keepdim=True).clamp_min(1e-12)


def _as_stored(kind: str, step, norm_p: float | None = None) -> torch.Tensor:
    """``[B, d]`` what a queue storing ``kind`` (of ``STORED_KINDS``) holds of ``step``'s
    arrivals, in float64; the normalized key for a kind it cannot rebuild."""
    k = step.k.to(torch.float64)
    if kind == "query":
        return F.normalize(step.z.to(torch.float64), dim=1)
    if kind == "raw key":
        return k
    if kind == "batch-normalized key":
        return F.normalize(k, dim=0)
    if kind == "rescaled key" and norm_p is not None:
        return _normalized_p(k, norm_p)
    return F.normalize(k, dim=1)


def _padded(keys: torch.Tensor, ids: torch.Tensor, capacity: int):
    """``(keys [capacity, d], ids [capacity])``: a preallocated queue of ``capacity`` zero rows
    (ids −1) holding ``keys`` ``[n, d]``, read whole, unfilled slots included."""
    missing = max(capacity - len(keys), 0)
    return (torch.cat([keys, keys.new_zeros(missing, keys.shape[1])]),
            torch.cat([ids, ids.new_full((missing,), -1)]))


def _slots_of_one_buffer(positions, ids, id_rule, capacity, batches,
                         batch_ids) -> torch.Tensor | None:
    """The arrivals ``[n]`` the queue's slots were filled with, when its ids ``[n]`` kept
    ``id_rule`` and its entries ``positions`` ``[n]`` are what views of one reused buffer show
    (``through_one_buffer``) after the arrival ``batches`` (with their ``batch_ids``); None
    otherwise."""
    if id_rule not in QUEUE_RULES or not bool((positions >= 0).all()):
        return None
    slots = queue_contents(id_rule, batches, capacity)[-1]
    if slots.shape != positions.shape or torch.equal(slots, positions):
        return None
    if not torch.equal(torch.cat(batch_ids).to(torch.int64)[slots], ids):
        return None
    shown = through_one_buffer(slots, batches, len(batches))
    return slots if torch.equal(shown, positions) else None


def _dim_first(queue: torch.Tensor, d: int) -> bool:
    """Whether a returned queue of keys ``d`` wide is stored ``[d, n]``, one key per column."""
    return queue.shape[1] != d and queue.shape[0] == d


def _unit_norm_p(entries: torch.Tensor) -> float | None:
    """The p of ``NORMS_NAMED`` for which every row of ``entries`` ``[n, d]`` has norm 1 (None:
    no such p; the entries are the keys at some other length)."""
    for p in NORMS_NAMED:
        norms = torch.linalg.vector_norm(entries, ord=p, dim=1)
        if bool(((norms - 1.0).abs() < 1e-4).all()):
            return p
    return None


LOSS_CHECK = "I8-loss-matches-recomputation"  # tells a loss no form explains, a NaN run


@dataclass
class LabStep:
    """One training step (one batch) as observed."""

    index: int
    epoch: int
    ids: torch.Tensor  # [B] source ids, in the query's row order
    z: torch.Tensor  # [B, d] the query encoder's raw projection
    grad: torch.Tensor | None  # [B, d] dL/dz as observed (None: no backward reached it)
    k: torch.Tensor  # [B, d] the key encoder's raw projection, row i the positive of query i
    key_seen: torch.Tensor | None  # [B] the ids in the order the key encoder ran on them
    query_event: int
    key_event: int
    key_has_grad_fn: bool
    key_grad_enabled: bool
    key_params: torch.Tensor  # [P] θk at the key forward
    key_tag: int  # the model copy that encoded the keys (another one if the key was replaced)
    query_params: torch.Tensor  # [P] θq at the key forward
    recomputed: tuple[torch.Tensor, torch.Tensor] | None  # old rows re-encoded before backward
    extra_key_rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list
    )  # (raw outputs [r, d], view calls [r], ids [r]) of every other key forward in the step


@dataclass
class QueryGradient:
    """θq's ``.grad`` around one step (see ``LabEvidence.query_gradients``)."""

    step: int
    fresh: torch.Tensor  # [P] the gradient of this step's loss, recomputed
    after: torch.Tensor | None  # [P] .grad when the next step's query forward ran
    before: torch.Tensor | None  # [P] .grad when this step's query forward ran


@dataclass
class QueueAnalysis:
    keys: torch.Tensor  # [n, d] the returned queue, oriented [n, d], float64
    ids: torch.Tensor  # [n] int64
    dim_first: bool  # returned as [d, n]
    total_arrivals: int
    capacity: int | None  # None when the queue never dropped an entry; 0 when it held none
    # per entry: one of STORED_KINDS, "recomputed key", "overwritten key" (see ``shown``),
    # "unknown"
    kinds: list[str]
    positions: torch.Tensor  # [n] arrival number each entry is a copy of (−1 unknown)
    sources: list[tuple[int, int]]  # (step, row) of each entry's arrival, (−1, −1) unknown
    key_rule: str | None  # rule of QUEUE_RULES that explains the positions
    id_rule: str | None  # "with-keys", or the rule that explains the ids on their own
    stored_kind: str  # what the queue stores: "key", "query", "raw key"
    arrival_ids: list[torch.Tensor]  # [B_t] per step
    arrival_positions: list[torch.Tensor]  # [B_t] per step
    norm_p: float | None = None  # "rescaled key": the p whose norm each entry has as 1
    # entries that are views of one reused buffer: the arrival each entry shows [n] (its
    # slot's arrival is ``positions``, as its id says); None when the entries are copies
    shown: torch.Tensor | None = None
    # ids kept as views of the epoch's order array, shuffled in place by later epochs: how
    # the loop read them (``id_views``); None when the ids are copies
    id_views: EpochOrders | None = None

    @property
    def changed_after_enqueue(self) -> bool:
        """Whether the entries are their keys' directions at lengths that follow their age
        (older entries longer or shorter than newer ones, no norm making them all 1): the stored
        queue was rescaled in place after enqueueing (``queue.div_(queue.norm())``,
        ``queue.mul_(0.9)``), not the keys enqueued at another length."""
        rescaled = [j for j, kind in enumerate(self.kinds) if kind == "rescaled key"]
        if self.stored_kind != "rescaled key" or self.norm_p is not None or len(rescaled) < 3:
            return False
        lengths = self.keys[rescaled].norm(dim=1)  # [r]
        if float(lengths.max() / lengths.min().clamp_min(1e-300)) < 1 + 1e-3:
            return False  # one length for all: enqueued at it
        ages = self.positions[rescaled].to(torch.float64)
        ranks = [torch.argsort(torch.argsort(v)).to(torch.float64) for v in (ages, lengths)]
        centred = [r - r.mean() for r in ranks]
        spread = float(centred[0].norm() * centred[1].norm())
        return spread > 0 and abs(float(centred[0] @ centred[1]) / spread) > 0.9

    def contents(self, rule: str | None, labels: list[torch.Tensor], steps: int) -> torch.Tensor:
        """Labels held after ``steps`` enqueues under ``rule`` (FIFO when unknown)."""
        if steps <= 0 or self.capacity == 0:  # capacity 0: the queue never held a key
            return torch.empty(0, dtype=torch.int64)
        capacity = self.capacity if self.capacity is not None else self.total_arrivals + 1
        return queue_contents(rule or "fifo", labels[:steps], capacity)[-1]

    def held_after(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(arrival positions [n], ids [n])`` the submission's queue held after ``steps``
        enqueues, by the rules identified from the returned queue; ids that are views of a
        reshuffled order as they read right after the last of those enqueues."""
        positions = self.contents(self.key_rule, self.arrival_positions, steps)
        if self.id_views is not None and len(positions):
            ids = self.id_views.seen(positions, steps - 1)
        elif self.id_rule in (None, "with-keys"):
            flat_ids = torch.cat(self.arrival_ids) if self.arrival_ids else torch.empty(0)
            ids = flat_ids[positions].to(torch.int64)
        else:
            ids = self.contents(self.id_rule, self.arrival_ids, steps)
        if self.shown is not None:
            positions = through_one_buffer(positions, self.arrival_positions, steps)
        return positions, ids


class LabEvidence:
    """Everything the ``lab`` checks judge, built from one observation record."""

    def __init__(self, observations: schema.LabRecord, options: GradeOptions) -> None:
        self.options = options
        self.record = observations
        self.probe = LabProbe.from_dict(observations.get("probe", {}))

    @property
    def warmup(self) -> schema.WarmupRecord | dict:
        return observed(self.record.get("moco_warmup")) or {}

    @property
    def training(self) -> schema.TrainingRecord:
        return observed(self.record.get("train_moco")) or {}

    # ----------------------------------------------------------------- training run

    def require_run(self) -> schema.TrainingRecord:
        """The training record; raises ``SubmissionError`` if ``train_moco`` failed."""
        if not self.training.get("defined", False):
            error = self.training.get("error") or ""
            raise SubmissionCrashed("train_moco", "train_moco could not be called" if error
                                    else "train_moco is not defined", error)
        if self.training.get("error"):
            raise SubmissionCrashed("train_moco", self.crash_summary(), self.training["error"])
        return self.training

    def crash_summary(self) -> str:
        """``train_moco raised at step 5 (epoch 1, batch 2 of the epoch, after 300 keys were
        made)``: where the run was, read from the probe's record of ``views`` calls (two per
        step; a batch repeating an id of the epoch so far starts a new epoch)."""
        calls = [c for c in self.training.get("view_calls", []) if isinstance(c, torch.Tensor)]
        if not calls:
            return "train_moco raised before its first step"
        step = (len(calls) - 1) // 2
        epoch, batch, seen, made = 0, -1, set(), 0
        for t in range(step + 1):
            ids = set(calls[2 * t].tolist())
            if seen & ids:
                epoch, batch, seen = epoch + 1, -1, set()
            seen |= ids
            batch += 1
            if t < step:
                made += len(ids)
        return (f"train_moco raised at step {step} (epoch {epoch}, batch {batch} of the epoch, "
                f"after {made} keys had been made)")

    @property
    def returned(self) -> schema.Returned:
        return self.require_run().get("returned", {})

    @cached_property
    def segments(self) -> list[tuple[str, slice]]:
        segments, offset = [], 0
        for entry in self.require_run()["layout"]:
            segments.append((entry["name"], slice(offset, offset + int(entry["numel"]))))
            offset += int(entry["numel"])
        return segments

    @cached_property
    def roles(self) -> tuple[int, int]:
        """``(query instance, key instance)``: the copies ``train_moco`` returned as query and
        key; failing that, the copy the loss's gradient reached and the other busiest one."""
        run = self.require_run()
        returned = run.get("returned", {})
        query, key = returned.get("query_instance", -1), returned.get("key_instance", -1)
        if query >= 0 and key >= 0 and query != key:
            return query, key
        events = run["events"]
        with_grad: dict[int, int] = {}
        busy: dict[int, int] = {}
        for event in events:
            busy[event["instance"]] = busy.get(event["instance"], 0) + 1
            if event["grad"] is not None:
                with_grad[event["instance"]] = with_grad.get(event["instance"], 0) + 1
        if query < 0 and with_grad:
            query = max(with_grad, key=with_grad.get)
        if (key < 0 or key == query) and busy:
            others = {tag: n for tag, n in busy.items() if tag != query}
            key = max(others, key=others.get) if others else query
        if query < 0 or key < 0:
            raise SubmissionError(
                "the grader could not tell the query encoder from the key encoder: train_moco "
                "returned no model that ran on the probe's images"
            )
        return query, key

    def _params(self, event: schema.ForwardEvent, tag: int) -> torch.Tensor:
        if tag in event["snapshot_tags"]:
            return event["params"][event["snapshot_tags"].index(tag)].to(torch.float64)
        raise SubmissionError(
            f"no parameter snapshot of model copy {tag}: train_moco made more model copies "
            "than the probe follows"
        )

    @cached_property
    def steps(self) -> list[LabStep]:
        """The steps, each query beside the key it was paired with: when the keys came back
        from a shuffled key batch in another order (``positive_order``), each step's ``k`` is
        in the submission's order, so the queue and the loss are followed as it ran them and
        I8 alone names the pairing."""
        steps = self.followed_steps
        order = self.positive_order
        if order is None:
            return steps
        return [replace(step, k=step.k[rows]) for step, rows in zip(steps, order.orders)]

    @cached_property
    def positive_order(self) -> PositiveOrder | None:
        """How the keys came back from a shuffled key batch when not in image order (read from
        the returned queue: ``judge.key_order``), or None."""
        steps = self.followed_steps
        try:
            queue, queue_ids = self.returned.get("queue"), self.returned.get("queue_ids")
        except Exception:  # noqa: BLE001 - a run without its returns is told by its checks
            return None
        if not isinstance(queue, torch.Tensor) or not isinstance(queue_ids, torch.Tensor) \
                or queue.ndim != 2 or not queue.is_floating_point():
            return None
        if _dim_first(queue, steps[0].k.shape[1]):
            queue = queue.T
        return find_positive_order([s.ids for s in steps], [s.k for s in steps],
                                   [s.key_seen for s in steps], queue, queue_ids,
                                   atol=MATCH_ATOL)

    @cached_property
    def followed_steps(self) -> list[LabStep]:
        """The steps as followed, each ``k`` in image order (row i: query i's own image)."""
        run = self.require_run()
        events, view_calls = run["events"], run["view_calls"]
        if not view_calls:
            raise SubmissionError(
                "train_moco never called views(...): the probe saw no batch (LAB 07 makes two "
                "views of every batch with the module-level `views`)"
            )
        batches: list[list[int]] = []
        for call, ids in enumerate(view_calls):
            if batches and len(batches[-1]) == 1 and torch.equal(view_calls[batches[-1][0]], ids):
                batches[-1].append(call)
            else:
                batches.append([call])
        batch_of_call = {c: b for b, calls in enumerate(batches) for c in calls}
        by_batch: dict[int, list[int]] = {}
        for index, event in enumerate(events):
            if event["view_calls"] > 0:
                by_batch.setdefault(batch_of_call[event["view_calls"] - 1], []).append(index)
        query_tag, key_tag = self.roles
        steps = self._follow(batches, view_calls, by_batch, query_tag, key_tag)
        if not steps and query_tag != key_tag and not any(
                event["instance"] == key_tag for event in events):
            # the key encoder train_moco returned never ran on an image: its keys came from
            # another forward of the query encoder (followed so, and charged by I1/I7)
            steps = self._follow(batches, view_calls, by_batch, query_tag, query_tag)
            self.keys_from_query_encoder = bool(steps)
        if not steps:
            raise SubmissionError(
                "no training step could be followed: no batch had both a query forward and a "
                "key forward of the model copies train_moco returned"
            )
        return steps

    keys_from_query_encoder = False  # set by ``steps``: the returned key encoder never ran

    @property
    def query_never_trained(self) -> bool:
        """Whether θq never changed over the run while the key encoder started as its copy:
        then an EMA toward θq leaves θk where it was, and the EMA cannot be seen."""
        steps = self.steps
        if len(steps) < 2:
            return False
        first = steps[0]
        return (all(torch.equal(step.query_params, first.query_params) for step in steps[1:])
                and first.key_params.shape == first.query_params.shape
                and torch.allclose(first.key_params, first.query_params, rtol=0, atol=1e-7))

    def require_key_encoder_used(self) -> None:
        """``CheckFailure`` when the keys were encoded by the query encoder (the key encoder
        ``train_moco`` returned never ran on an image), said in those words."""
        _ = self.steps  # following the steps decides keys_from_query_encoder
        if self.keys_from_query_encoder:
            first = self.steps[0]
            fail("the keys were encoded by the query encoder: the key encoder train_moco "
                 "returned never ran on an image", where=f"from step 0 (ids {fmt_ids(first.ids)})",
                 expected="k = key(view_k), the momentum encoder's output",
                 got="k = query(view_k) at every step (the key encoder's EMA, if any, moves a "
                     "model no key comes from)")

    def _follow(self, batches, view_calls, by_batch, query_tag, key_tag) -> list[LabStep]:
        run = self.require_run()
        steps: list[LabStep] = []
        seen: set[int] = set()
        epoch = 0
        n_train = len(run["train"])
        for b, calls in enumerate(batches):
            segments = self._substeps(calls, by_batch.get(b, []), query_tag, key_tag)
            for segment in segments:
                # an epoch ends when every training id was seen, or when a batch brings back an
                # id this epoch already had (its last partial batch was dropped, as the official
                # training loop does with drop_last)
                step = self._step(len(steps), epoch, calls, segment, query_tag, key_tag)
                batch_ids = (set(view_calls[calls[0]].tolist()) if len(segments) == 1 or step
                             is None else set(step.ids.tolist())) - {-1}
                if seen and batch_ids & seen:
                    seen, epoch = set(), epoch + 1
                if step is None:
                    continue
                step.epoch = epoch
                steps.append(step)
                seen.update(step.ids.tolist())
                if len(seen) >= n_train:
                    seen, epoch = set(), epoch + 1
        return steps

    def _substeps(self, calls, event_indices, query_tag, key_tag) -> list[list[int]]:
        """The forwards of one pair of ``views`` calls, as the steps they belong to. Usually one
        step; when ``views`` ran on more images than a batch (e.g. on the whole training set
        once per epoch, each batch slicing those views), every query forward on ids no other
        one had, paired with the key forward on the same ids, is a step of its own."""
        if query_tag == key_tag or len(event_indices) < 4:
            return [event_indices]
        events = self.require_run()["events"]
        calls_t = torch.tensor(calls)

        def ids_of(i: int) -> frozenset:
            rows = torch.isin(events[i]["rows_call"], calls_t)
            return frozenset(events[i]["rows_id"][rows].tolist())

        queries = [i for i in event_indices if events[i]["instance"] == query_tag and ids_of(i)]
        if len(queries) < 2:
            return [event_indices]
        id_sets = [ids_of(i) for i in queries]
        if sum(map(len, id_sets)) != len(frozenset().union(*id_sets)):
            return [event_indices]  # queries share ids (e.g. a symmetric loss): one step
        keys = [i for i in event_indices if events[i]["instance"] == key_tag]
        pairs = []
        for q, ids in zip(queries, id_sets):
            k = next((i for i in keys if ids_of(i) == ids), None)
            if k is None:
                return [event_indices]
            pairs.append((min(q, k), max(q, k)))
        starts = [start for start, _ in pairs]
        if any(end >= later for (_, end), later in zip(pairs, starts[1:])):
            return [event_indices]  # the pairs interleave: not one step after another
        bounds = starts[1:] + [event_indices[-1] + 1]
        first = [i for i in event_indices if i < starts[0]]
        return [([*first] if n == 0 else []) + [i for i in event_indices if start <= i < end]
                for n, (start, end) in enumerate(zip(starts, bounds))]

    def _step(self, index, epoch, calls, event_indices, query_tag, key_tag) -> LabStep | None:
        events = self.require_run()["events"]
        calls_t = torch.tensor(calls)

        def current_rows(event: schema.ForwardEvent) -> torch.Tensor:
            # rows from this batch's views, or raw images (no view call to place them by)
            return torch.isin(event["rows_call"], calls_t) | (event["rows_call"] == -1)

        candidates = [i for i in event_indices if bool(current_rows(events[i]).any())]
        if query_tag == key_tag:
            own = [i for i in candidates if events[i]["instance"] == query_tag]
            if len(own) < 2:
                return None
            query_index, key_index = own[0], own[1]
        else:
            queries = [i for i in candidates if events[i]["instance"] == query_tag]
            keys = [i for i in candidates if events[i]["instance"] == key_tag]
            if queries and not keys:
                # the key encoder was replaced (a fresh copy): the copy that encoded this
                # batch's keys is the key encoder of this step, judged like any other
                keys = [i for i in candidates if events[i]["instance"] != query_tag]
                key_tag = events[keys[0]]["instance"] if keys else key_tag
            if not queries or not keys:
                return None
            query_index, key_index = queries[0], keys[0]
        query_event, key_event = events[query_index], events[key_index]
        q_rows = current_rows(query_event)
        ids = query_event["rows_id"][q_rows]
        z = query_event["output"][q_rows]
        grad = query_event["grad"][q_rows] if query_event["grad"] is not None else None
        k_rows = current_rows(key_event)
        k, k_ids = key_event["output"][k_rows], key_event["rows_id"][k_rows]
        k = self._align(k, k_ids, ids, index)  # in image order; see ``positive_order``
        backward = query_event["grad_clock"] if query_event["grad_clock"] >= 0 else None
        extra, recomputed_rows = [], []
        for i in event_indices:
            event = events[i]
            if event["instance"] != key_tag or (query_tag == key_tag and i == query_index):
                continue
            rows = ~current_rows(event) if i == key_index else torch.ones_like(current_rows(event))
            if not bool(rows.any()):
                continue
            item = (event["output"][rows], event["rows_call"][rows], event["rows_id"][rows])
            extra.append(item)
            if backward is None or event["clock"] < backward:
                recomputed_rows.append(item)
        recomputed = None
        if recomputed_rows:
            recomputed = (
                torch.cat([r[0] for r in recomputed_rows]),
                torch.cat([r[2] for r in recomputed_rows]),
            )
        return LabStep(
            index=index,
            epoch=epoch,
            ids=ids,
            z=z,
            grad=grad,
            k=k,
            key_seen=k_ids if len(k_ids) == len(ids) else None,
            query_event=query_index,
            key_event=key_index,
            key_has_grad_fn=bool(key_event["output_has_grad_fn"]),
            key_grad_enabled=bool(key_event["grad_enabled"]),
            key_params=self._params(key_event, key_tag),
            key_tag=key_tag,
            query_params=self._params(key_event, query_tag),
            recomputed=recomputed,
            extra_key_rows=extra,
        )

    @staticmethod
    def _align(k: torch.Tensor, k_ids: torch.Tensor, ids: torch.Tensor, step: int) -> torch.Tensor:
        """Key rows reordered to the query's row order (by source id)."""
        perm = shuffle_of(ids, k_ids)  # k's row r is the key of ids[perm[r]]
        if perm is not None:
            return k[torch.argsort(perm)]
        if len(k) == len(ids):
            return k
        raise SubmissionError(
            f"at step {step} the key encoder saw ids {fmt_ids(k_ids)} but the query encoder "
            f"saw {fmt_ids(ids)}: the grader cannot pair queries with their positives"
        )

    # ----------------------------------------------------------------- basic facts

    @cached_property
    def batch_size(self) -> int:
        return max(len(step.ids) for step in self.steps)

    @cached_property
    def epochs_observed(self) -> int:
        return self.steps[-1].epoch + 1

    def step_where(self, t: int) -> str:
        step = self.steps[t]
        return f"step {t} (epoch {step.epoch}, ids {fmt_ids(step.ids)})"

    # ----------------------------------------------------------------- I2, I3

    @cached_property
    def queue(self) -> QueueAnalysis:
        returned = self.returned
        keys, ids = returned.get("queue"), returned.get("queue_ids")
        if not isinstance(keys, torch.Tensor) or keys.ndim != 2 or not keys.is_floating_point():
            raise SubmissionError(
                f"train_moco's third return value must be the queue, a [n, d] float tensor; "
                f"got {describe_value(keys)}"
            )
        if not isinstance(ids, torch.Tensor) or ids.ndim != 1:
            raise SubmissionError(
                f"train_moco's fourth return value must be queue_ids, a [n] tensor; got "
                f"{describe_value(ids)}"
            )
        d = int(self.require_run()["projection_dim"])
        dim_first = _dim_first(keys, d)
        if keys.shape[1] != d and not dim_first:
            raise NotJudged(
                "contract-returns-seven-values",
                f"train_moco returned a queue of {keys.shape[0]} rows {keys.shape[1]} wide, but "
                f"the keys its key encoder made are {d} wide: no entry can be read as a key")
        keys = (keys.T if dim_first else keys).to(torch.float64)
        ids = ids.to(torch.int64)
        steps = self.steps
        arrival_ids = [s.ids for s in steps]
        positions_per_step = arrival_numbers([len(s.ids) for s in steps])
        total = sum(len(s.ids) for s in steps)
        capacity = len(keys) if total > len(keys) else None  # 0: the queue never held a key

        # Candidates an entry may be a copy of: [M, d], with (kind, position) per row.
        tables, labels = [], []
        for kind in ("key", "query", "raw key", "batch-normalized key"):
            for t, s in enumerate(steps):
                tables.append(_as_stored(kind, s))
                labels += [(kind, int(p)) for p in positions_per_step[t]]
        position_of = {
            (t, int(i)): int(p)
            for t, s in enumerate(steps)
            for i, p in zip(s.ids.tolist(), positions_per_step[t])
        }
        step_of_call = self._step_of_call()
        for s in steps:
            for outputs, calls, row_ids in s.extra_key_rows:
                tables.append(F.normalize(outputs.to(torch.float64), dim=1))
                for c, i in zip(calls.tolist(), row_ids.tolist()):
                    labels.append(("recomputed key", position_of.get((step_of_call.get(c, -1), i),
                                                                     -1)))
        candidates = torch.cat(tables) if tables else torch.empty(0, d, dtype=torch.float64)
        index, _ = match_rows(keys, candidates, atol=MATCH_ATOL)
        kinds = [labels[i][0] if i >= 0 else "unknown" for i in index.tolist()]
        # keys normalized with another norm point as the key does: the first ``total``
        # candidates are the normalized keys
        unknown = [j for j, kind in enumerate(kinds) if kind == "unknown"]
        if unknown and total:
            along, _ = match_rows(F.normalize(keys[unknown], dim=1), candidates[:total],
                                  atol=MATCH_ATOL)
            for j, i in zip(unknown, along.tolist()):
                if i >= 0 and abs(float(keys[j].norm()) - 1.0) > 1e-3:
                    index[j], kinds[j] = i, "rescaled key"
        rescaled = [j for j, kind in enumerate(kinds) if kind == "rescaled key"]
        norm_p = _unit_norm_p(keys[rescaled]) if rescaled else None
        positions = torch.tensor([labels[i][1] if i >= 0 else -1 for i in index.tolist()],
                                 dtype=torch.int64)
        step_row = {}
        for t, block in enumerate(positions_per_step):
            for row, p in enumerate(block.tolist()):
                step_row[p] = (t, row)
        sources = [step_row.get(int(p), (-1, -1)) for p in positions.tolist()]

        rule_capacity = capacity if capacity is not None else total + 1
        key_rule, id_rule = None, None
        if rule_capacity > 0:  # an empty queue was kept by no rule at all
            if bool((positions >= 0).all()):
                key_rule = identify_queue_rule(positions, positions_per_step, rule_capacity)
            flat_ids = torch.cat(arrival_ids)
            if (key_rule is not None and len(ids) == len(positions)
                    and torch.equal(ids, flat_ids[positions])):
                id_rule = "with-keys"
            else:
                id_rule = identify_queue_rule(ids, arrival_ids, rule_capacity)
        counted = [k for k in kinds if k in STORED_KINDS]
        stored = max(STORED_KINDS, key=counted.count) if counted else "key"
        shown = None
        slots = _slots_of_one_buffer(positions, ids, id_rule, rule_capacity, positions_per_step,
                                     arrival_ids)
        if key_rule is None and slots is not None:
            # the ids kept a queue rule, the keys show later batches: one reused buffer
            shown = positions
            kinds = [kind if int(a) == int(b) else "overwritten key"
                     for kind, a, b in zip(kinds, slots, shown)]
            positions, key_rule, id_rule = slots, id_rule, "with-keys"
            sources = [step_row.get(int(p), (-1, -1)) for p in positions.tolist()]
        id_views = None
        if key_rule is not None and id_rule != "with-keys":
            orders = EpochOrders.of(arrival_ids, [s.epoch for s in steps])
            id_views = orders if orders.explains(positions, ids) else None
        return QueueAnalysis(
            keys=keys,
            ids=ids,
            dim_first=dim_first,
            total_arrivals=total,
            capacity=capacity,
            kinds=kinds,
            positions=positions,
            sources=sources,
            key_rule=key_rule,
            id_rule=id_rule,
            stored_kind=stored,
            arrival_ids=arrival_ids,
            arrival_positions=positions_per_step,
            norm_p=norm_p,
            shown=shown,
            id_views=id_views,
        )

    def require_entries(self, what: str) -> QueueAnalysis:
        """The queue analysis; ``NotExercised`` (not judged, never passed) when the queue
        ``train_moco`` returned holds no entry although keys were made: there is nothing to
        judge ``what`` on (the empty queue itself is I3-fifo-keeps-newest's failure)."""
        queue = self.queue
        if len(queue.keys) == 0 and queue.total_arrivals > 0:
            raise NotExercised(
                f"not judged: the queue train_moco returned holds no entry ({queue.total_arrivals}"
                f" keys were made over {len(self.steps)} steps and none was kept), so there is "
                f"no stored entry {what} (I3-fifo-keeps-newest charges the empty queue)")
        return queue

    def _step_of_call(self) -> dict[int, int]:
        """View call → step index, via each step's query event rows."""
        events = self.require_run()["events"]
        mapping = {}
        for s in self.steps:
            for c in events[s.query_event]["rows_call"].unique().tolist():
                mapping[int(c)] = s.index
            for c in events[s.key_event]["rows_call"].unique().tolist():
                mapping.setdefault(int(c), s.index)
        return mapping

    def stored_values(self) -> torch.Tensor:
        """``[total, d]`` the vector the submission stores for each arrival, by what its
        queue was found to hold (normalized keys unless it holds queries or raw keys)."""
        queue = self.queue
        return torch.cat([_as_stored(queue.stored_kind, s, queue.norm_p) for s in self.steps])

    # ----------------------------------------------------------------- I6, I7

    @cached_property
    def ema(self):
        run = self.require_run()
        events = run["events"]
        returned = run.get("returned", {})
        query_tag, key_tag = self.roles
        steps = self.steps
        updates = []

        def latest_differing(first: int, last: int, after: torch.Tensor, fallback, tag=key_tag):
            for i in range(last, first - 1, -1):
                if tag in events[i]["snapshot_tags"]:
                    snapshot = self._params(events[i], tag)
                    if not torch.equal(snapshot, after):
                        return snapshot
            return fallback

        for t in range(1, len(steps)):
            previous, now = steps[t - 1], steps[t]
            before = latest_differing(previous.key_event, now.key_event - 1, now.key_params,
                                      previous.key_params, now.key_tag)
            updates.append(KeyUpdate(t, previous.key_params, before, now.key_params,
                                     now.query_params, previous.query_params))
        if isinstance(returned.get("key_params"), torch.Tensor) and isinstance(
            returned.get("query_params"), torch.Tensor
        ):
            last = steps[-1]
            final_key = returned["key_params"].to(torch.float64)
            before = latest_differing(last.key_event, len(events) - 1, final_key, last.key_params)
            updates.append(KeyUpdate(len(steps), last.key_params, before, final_key,
                                     returned["query_params"].to(torch.float64),
                                     last.query_params, final=True))
        return analyse_key_updates(updates, self.segments)

    # ----------------------------------------------------------------- I4, I8, I9

    @cached_property
    def loss_inputs(self) -> list[StepLossInputs]:
        queue = self.queue
        values = self.stored_values()
        d = values.shape[1]
        any_recomputed = any(s.recomputed is not None for s in self.steps)
        inputs, offset = [], 0
        for t, s in enumerate(self.steps):
            negatives = {}
            for name, count in (("before", t), ("after", t + 1)):
                positions, ids = queue.held_after(count)
                negatives[name] = (values[positions], ids)
            held, held_ids = negatives["before"]
            current = values[offset:offset + len(s.ids)]  # this batch's keys, as stored
            negatives["with-current"] = (torch.cat([held, current]),
                                         torch.cat([held_ids, s.ids.to(held_ids.dtype)]))
            offset += len(s.ids)
            if queue.capacity:  # a preallocated queue read whole: once it holds a key, or always
                negatives["with-empty-slots"] = (_padded(held, held_ids, queue.capacity)
                                                 if len(held) else (held, held_ids))
                negatives["zero-initialized"] = _padded(held, held_ids, queue.capacity)
            if any_recomputed:
                if s.recomputed is None:
                    negatives["recomputed"] = (torch.empty(0, d, dtype=torch.float64),
                                               torch.empty(0, dtype=torch.int64))
                else:
                    outputs, ids = s.recomputed
                    negatives["recomputed"] = (F.normalize(outputs.to(torch.float64), dim=1), ids)
            inputs.append(StepLossInputs(z=s.z, k=s.k, ids=s.ids, negatives=negatives,
                                         grad=s.grad))
        return inputs

    @cached_property
    def loss(self):
        if all(s.grad is None for s in self.steps):
            raise SubmissionError(
                "no gradient ever reached the query encoder's projection: is loss.backward() "
                "called on a loss computed from query(view)?"
            )
        return identify_loss_form(self.loss_inputs, self.options.temperature)

    @cached_property
    def first_non_finite(self) -> tuple[int, str] | None:
        """``(step, what)`` of the first step whose recorded values hold a NaN or an infinity
        (the query's projection, dL/dz, the key, θq or θk), or None: a run the grader follows
        only while it stays finite."""
        for step in self.steps:
            for name, value in (("the query's projection z", step.z), ("dL/dz", step.grad),
                                ("the key", step.k), ("θq", step.query_params),
                                ("θk", step.key_params)):
                if isinstance(value, torch.Tensor) and value.numel() and \
                        not bool(torch.isfinite(value).all()):
                    return step.index, name
        return None

    def require_finite(self, what: str) -> None:
        """``NotJudged`` (needs the loss check, which tells it) when the run turned NaN or
        infinite: ``what`` would be compared among NaN values, which match nothing."""
        try:
            found = self.first_non_finite
        except Exception:  # noqa: BLE001 - a run read otherwise says what it lacks
            return
        if found is not None:
            raise NotJudged(LOSS_CHECK, f"{what} cannot be judged on a run that became NaN or "
                                        f"infinite at step {found[0]} ({found[1]}); the grader "
                                        "follows a run only while it stays finite")

    @cached_property
    def loss_diagnosis(self) -> LossDiagnosis:
        return diagnose_loss(self.loss_inputs, self.loss)

    def queue_context(self, t: int) -> str:
        """``the queue holding 240 keys, 3 of them from a query's own image``."""
        held = len(self.loss_inputs[t].negatives["before"][1])
        if not held:
            return "the queue empty"
        pairs = self.collisions(t)
        return f"the queue holding {held} keys" + (
            f", {pairs} (query, key) pairs from one image" if pairs else "")

    def collisions(self, t: int, negatives: str = "before") -> int:
        """How many (query, negative) pairs of step t share a source id."""
        step = self.loss_inputs[t]
        _, ids = step.negatives.get(negatives, (None, torch.empty(0, dtype=torch.int64)))
        return int(same_source_mask(step.ids, ids).sum())

    # ----------------------------------------------------------------- report

    @cached_property
    def query_gradients(self) -> list[QueryGradient]:
        """For each step followed by another: the query encoder's ``.grad`` when the next
        step's query forward ran, the one at this step's, and the gradient this step's loss
        gives θq — recomputed here through the probe model from the recorded parameters,
        inputs and the gradient that reached the outputs. Steps whose inputs cannot be
        rebuilt, or with more than one backward into the query encoder, are left out."""
        from moco_ref.judge.lab_record import event_inputs, view_inputs
        from moco_ref.probe.lab import LabProbeWorld, ProbeNet

        run = self.require_run()
        if run.get("input_mutated"):
            return []
        events, steps = run["events"], self.steps
        query_tag = self.roles[0]
        world = LabProbeWorld(self.probe)
        inputs = view_inputs(run["view_calls"], world)
        out = []
        for step, following in zip(steps, steps[1:]):
            between = [events[i] for i in range(step.query_event, following.query_event)
                       if events[i]["instance"] == query_tag and events[i]["grad"] is not None]
            if len(between) != 1:
                continue
            event = between[0]
            rows, x = event_inputs(event, inputs, world)
            if not rows or len(rows) != len(event["rows_call"]):
                continue  # some input cannot be rebuilt: its gradient share is unknown
            net = ProbeNet()
            torch.nn.utils.vector_to_parameters(self._params(event, query_tag).to(torch.float32),
                                                net.parameters())
            _, projection = net(x)
            grads = torch.autograd.grad(projection, list(net.parameters()), event["grad"])
            fresh = torch.cat([g.reshape(-1) for g in grads]).to(torch.float64)
            later = events[following.query_event].get("own_grad")  # optional in the record
            earlier = events[step.query_event].get("own_grad")
            out.append(QueryGradient(step.index, fresh,
                                     None if later is None else later.to(torch.float64),
                                     None if earlier is None else earlier.to(torch.float64)))
        return out

    def inferred(self) -> dict:
        """Values inferred from the trace, for the report (best effort, never raises)."""
        found: dict = {}
        for name, getter in (
            ("batch_size", lambda: self.batch_size),
            ("steps", lambda: len(self.steps)),
            ("epochs", lambda: self.epochs_observed),
            ("capacity", lambda: self.queue.capacity),
            ("m", lambda: None if self.ema.m is None else round(self.ema.m, 6)),
            ("order", lambda: self.ema.order),
            ("temperature", lambda: self.loss.temperature),
            ("loss_form", lambda: self.loss.form.describe()),
        ):
            try:
                found[name] = getter()
            except Exception:  # noqa: BLE001 - a missing value is reported by its check
                continue
        return found
