"""I3: the FIFO keeps the newest ``capacity`` keys, oldest first, with their ids."""

from __future__ import annotations

import torch

from moco_ref.judge.assertions import (
    NotExercised,
    NotJudged,
    NotRequired,
    at_step,
    fail,
    fmt_ids,
    fmt_range,
    require,
)
from moco_ref.judge.builder_defaults import enqueue_at_defaults
from moco_ref.judge.builder_evidence import SYMMETRIC, BuilderEvidence
from moco_ref.judge.builder_record import BUILDER_INTERFACE
from moco_ref.judge.checks.builder_columns import (
    describe_labels,
    describe_order,
    step_runs,
    traced,
)
from moco_ref.judge.checks.common import (
    builder_where,
    case_where,
    pointer_text,
    queue_runs,
)
from moco_ref.judge.components_evidence import ComponentsEvidence
from moco_ref.judge.invariants import (
    expected_fifo,
    fifo_contents,
    oldest_first,
    rotation_of,
)
from moco_ref.judge.invariants.buffer import pointer_after
from moco_ref.judge.lab_evidence import LabEvidence
from moco_ref.judge.registry import check
from moco_ref.probe.builder import KEY_VIEW, VIEW_NAMES
from moco_ref.probe.cases import QueueCase


def _positions_known(ev: LabEvidence) -> bool:
    return bool((ev.queue.positions >= 0).all())


def _final_where(ev: LabEvidence) -> str:
    last = ev.steps[-1]
    return at_step(last.index, last.ids, after=True)


_ID_RULE_TEXT = {
    "fifo": "the last {}, oldest first",
    "keeps-oldest": "the first {} ever enqueued",
    "newest-first": "the last {}, newest first",
}


FIFO_KEEPS_NEWEST = check(
    "I3-fifo-keeps-newest",
    "the queue keeps the newest keys and drops the oldest",
    points=2,
    contract=(
        "After an enqueue the queue holds the last `capacity` keys in arrival order: when it is "
        "full the oldest entries leave, for any sequence of batch sizes."
    ),
)


@FIFO_KEEPS_NEWEST.judges('lab')
def i3_fifo_keeps_newest_lab(ev: LabEvidence) -> str | None:
    """After every enqueue the queue holds the last ``capacity`` keys in arrival order — the
    oldest are dropped first, also when a batch does not divide the capacity (the probe's
    queue wraps in the middle of a batch)."""
    ev.require_finite("which keys the queue kept")
    queue = ev.queue
    if queue.capacity == 0:
        fail("the queue never received a key (is the enqueue missing, or is its result thrown "
             "away?)", where=_final_where(ev),
             expected=f"the last keys of the {queue.total_arrivals} made over "
                      f"{len(ev.steps)} steps",
             got="an empty queue (and "
                 f"{len(queue.ids)} queue_ids)")
    expected_capacity = ev.options.expect_capacity
    # what a queue that never dropped an entry is held to: the pinned capacity, else the one
    # the source states (``pipeline.with_stated_capacity`` reads it only when none is pinned)
    held_to = expected_capacity if expected_capacity is not None else ev.options.stated_capacity
    if held_to is not None and queue.capacity is None and queue.total_arrivals > held_to:
        stated = "" if expected_capacity is not None else \
            f" that train_moco sets on line {ev.options.stated_capacity_line}"
        fail("the queue is never trimmed to its capacity: it kept every key enqueued over the "
             f"run and grows past the capacity{stated} (without bound, if nothing trims it)",
             where=_final_where(ev),
             expected=f"the newest {held_to} keys (capacity {held_to}, "
                      "e.g. torch.cat([queue, k])[-capacity:])",
             got=f"all {queue.total_arrivals} keys of the {len(ev.steps)} steps")
    if expected_capacity is not None:
        require(len(queue.keys) == min(expected_capacity, queue.total_arrivals),
                "the queue does not have the assignment's capacity", where=_final_where(ev),
                expected=f"{min(expected_capacity, queue.total_arrivals)} entries "
                         f"(capacity {expected_capacity})", got=f"{len(queue.keys)} entries")
    if queue.capacity is None:
        raise NotExercised(
            f"not exercised: the queue never dropped an entry ({queue.total_arrivals} keys "
            f"enqueued, {len(queue.keys)} kept), so its capacity is at least "
            f"{len(queue.keys)} and the FIFO rule was never put to work (if the assignment's "
            "capacity is smaller, the queue is never trimmed: grade with --expect-capacity N "
            "to hold it to N)")
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


@FIFO_KEEPS_NEWEST.judges('builder')
def i3_fifo_keeps_newest_builder(ev: BuilderEvidence) -> str | None:
    """After every step the buffer holds the last K entries in arrival order (the K it starts
    with count as the oldest): a step's keys overwrite the oldest columns, and no entry is
    dropped while an older one stays (the reference ``KeyQueue`` gives the expected set). Built
    at its own defaults (K = 65536 for the official module), each step still enqueues."""
    K, B = ev.probe.K, ev.probe.batch
    _require_fifo(ev, "")
    ragged = ev.ragged()
    if ragged is not None:
        _require_fifo(ragged, f" (a second run with K = {ragged.probe.K}, not a multiple of the "
                              f"batch {B}, so an enqueue wraps in mid-batch)")
        note = f"; with K = {ragged.probe.K} the wrap in mid-batch kept the FIFO"
    else:
        refusal = ev.ragged_refusal()
        note = f"; K not a multiple of the batch refused loudly ({refusal})" if refusal else ""
    return (f"K = {K}, the queue wrapped {(len(ev.steps) * B) // K} time(s){note}"
            + enqueue_at_defaults(ev))


def _never_written(ev: BuilderEvidence) -> bool:
    """Whether no step of the run changed the queue buffer or its pointer (a one-process crash
    is told first)."""
    steps = ev.steps
    return bool(steps) and all(
        step.queue_before is not None and step.queue_after is not None
        and torch.equal(step.queue_before, step.queue_after) and step.ptr_before == step.ptr_after
        for step in steps)


def _require_fifo(ev: BuilderEvidence, run: str) -> None:
    K, B = ev.probe.K, ev.probe.batch
    if _never_written(ev):
        last = ev.steps[-1]
        fail("the queue is never written: no step enqueued a key, so the negatives are the "
             "starting random keys for the whole run (is _dequeue_and_enqueue skipped when "
             "forward runs as training calls it, behind a flag or a condition?)" + run,
             where=f"{builder_where(last.index, after=True)} ({pointer_text(last)})",
             expected=f"each step's {B} keys written at queue_ptr, the pointer advancing by {B}",
             got=f"the buffer and queue_ptr as they started, after {len(ev.steps)} steps")
    for step in ev.steps:
        got = traced(ev, step)
        expected = expected_fifo(K, B, step.index + 1)
        if sorted(got.tolist()) == sorted(expected.tolist()):
            continue
        dropped = sorted(set(expected.tolist()) - set(got.tolist()))
        kept = sorted(set(got.tolist()) - set(expected.tolist()))
        stuck = step.ptr_before is not None and step.ptr_before == step.ptr_after
        misconception = ("queue_ptr did not advance: every step overwrote the same columns"
                         if stuck else "the queue did not keep the newest keys")
        fail(misconception + run,
             where=f"{builder_where(step.index, after=True)} ({pointer_text(step)})",
             expected=f"the last {K} entries: {describe_labels(ev, expected)}",
             got=f"{describe_labels(ev, dropped)} dropped while "
                 f"{describe_labels(ev, kept)} stayed")


@FIFO_KEEPS_NEWEST.judges('components')
def i3_fifo_keeps_newest_components(ev: ComponentsEvidence) -> str | None:
    """After every enqueue ``KeyQueue`` holds the last ``capacity`` keys in arrival order and
    ``len(queue)`` counts them — for any batch sizes, including batches that do not divide the
    capacity and batches larger than it."""
    for number, case, e, want, got, keys, _, length in queue_runs(ev):
        require(length == len(want) and len(keys) == len(want), "len(queue) is not the number of "
                "keys held", where=case_where(number, case, e), expected=len(want),
                got=f"len {length}, {len(keys)} rows")
        if sorted(got.tolist()) != sorted(want.tolist()):
            oldest = sorted(got.tolist()) == list(range(len(want)))
            fail("queue kept the oldest keys" if oldest else "queue did not keep the newest keys",
                 where=case_where(number, case, e), expected=f"arrivals {fmt_ids(want)}",
                 got=f"arrivals {fmt_ids(got)}")
    return None


OLDEST_FIRST_ORDER = check(
    "I3-oldest-first-order",
    "the queue is returned oldest first",
    points=1,
    contract=(
        "The queue is read oldest first (a ring buffer is read from its pointer), so the order "
        "of the entries is the order they arrived in."
    ),
)


@OLDEST_FIRST_ORDER.judges('lab')
def i3_oldest_first_order_lab(ev: LabEvidence) -> str | None:
    """The queue lists its entries in arrival order, oldest first (a ring buffer is rotated to
    start at its oldest slot)."""
    queue = ev.require_entries("to read in order")
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


@OLDEST_FIRST_ORDER.judges('builder')
def i3_oldest_first_order_builder(ev: BuilderEvidence) -> str | None:
    """Read from ``queue_ptr`` on, the buffer lists its entries oldest first: the pointer
    advances by the batch size (mod K) and always marks the next column to overwrite, the
    oldest one."""
    K, B = ev.probe.K, ev.probe.batch
    for step in ev.steps:
        if step.ptr_after is None:
            raise NotJudged(BUILDER_INTERFACE, "the module has no integer queue_ptr buffer to "
                                               "read the queue from")
        got = traced(ev, step)
        expected = expected_fifo(K, B, step.index + 1)
        if sorted(got.tolist()) != sorted(expected.tolist()):
            continue  # which entries are held is I3-fifo-keeps-newest's business
        read = oldest_first(got, step.ptr_after % K)
        if step_runs(ev, read) == step_runs(ev, expected):
            continue  # one step's keys among themselves come in the key batch's order (I8's)
        expected_ptr = None if step.ptr_before is None else pointer_after(K, step.ptr_before % K,
                                                                           B)
        fail("queue_ptr does not mark the oldest column",
             where=f"{builder_where(step.index, after=True)} "
             f"({pointer_text(step)})",
             expected=f"queue_ptr {expected_ptr} (advanced by the batch size {B} mod {K}), "
                      f"the buffer read from it oldest first: {describe_order(ev, expected)}",
             got=f"read from queue_ptr {step.ptr_after}: {describe_order(ev, read)}")
    return None


@OLDEST_FIRST_ORDER.judges('components')
def i3_oldest_first_order_components(ev: ComponentsEvidence) -> str | None:
    """``KeyQueue.keys`` (and ``.ids``) list the entries oldest first."""
    for number, case, e, want, got, _, _, _ in queue_runs(ev):
        if sorted(got.tolist()) == sorted(want.tolist()):
            require(torch.equal(got, want), "queue entries are not oldest first",
                    where=case_where(number, case, e), expected=f"arrivals {fmt_ids(want)}",
                    got=f"arrivals {fmt_ids(got)}")
    return None


IDS_MOVE_WITH_KEYS = check(
    "I3-ids-move-with-keys",
    "each queued id is the source of its key",
    points=2,
    contract=(
        "Every queued source id is the id of the image its key came from: ids enter, move and "
        "leave together with their keys."
    ),
)


@IDS_MOVE_WITH_KEYS.judges('lab')
def i3_ids_move_with_keys_lab(ev: LabEvidence) -> str | None:
    """``queue_ids[j]`` is the source id of the image whose key is ``queue[j]``: ids are
    enqueued and dropped together with their keys."""
    ev.require_finite("which id each queued key has")
    queue = ev.require_entries("whose id could be compared with its key's")
    if _positions_known(ev):
        flat = torch.cat(queue.arrival_ids)
        expected = flat[queue.positions]
    else:
        capacity = queue.capacity or queue.total_arrivals + 1
        expected = fifo_contents(queue.arrival_ids, capacity)[-1]
    if torch.equal(queue.ids, expected):
        return None
    if queue.id_views is not None:
        _fail_id_views(ev, queue, expected)
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


def _fail_id_views(ev: LabEvidence, queue, expected: torch.Tensor) -> None:
    views = queue.id_views
    wrong = (queue.ids != expected).nonzero().flatten()
    j = int(wrong[0])
    position = int(queue.positions[j])
    step, _ = queue.sources[j]
    last = len(views.orders) - 1
    fail("the stored ids changed after they were enqueued: queue_ids holds views of the "
         "epoch's order array (ids = order[i:i+B] kept without .clone()), which a later epoch "
         "shuffled in place (np.random.shuffle(order), order.copy_(…)), so every id enqueued "
         "in an earlier epoch now reads the new order at its slot — in the mask, the trace and "
         "the returned queue_ids alike",
         where=f"queue entry {j} (key of image {int(expected[j])}, enqueued at step {step}, "
               f"position {int(views.offset[position])} of epoch {int(views.epoch[position])}'s "
               f"order), {len(wrong)} of {len(expected)} entries:",
         expected=f"id {int(expected[j])}",
         got=f"queue_ids[{j}] = {int(queue.ids[j])}, epoch {last}'s order at that position")


@IDS_MOVE_WITH_KEYS.judges('components')
def i3_ids_move_with_keys_components(ev: ComponentsEvidence) -> str | None:
    """``KeyQueue.ids[j]`` is the id enqueued with ``KeyQueue.keys[j]``."""
    for number, case, e, _, got, _, ids, _ in queue_runs(ev):
        all_ids = torch.cat([i for _, i in case.batches()])
        known = got >= 0
        expected = all_ids[got[known]]
        observed = torch.where(ids >= QueueCase.SCRIBBLE, ids - QueueCase.SCRIBBLE, ids)[known]
        require(torch.equal(observed, expected), "ids are out of step with their keys",
                where=case_where(number, case, e), expected=f"ids {fmt_ids(expected)}",
                got=f"ids {fmt_ids(observed)}")
    return None


KEYS_OF_ALL_RANKS = check(
    "I3-keys-of-all-ranks",
    "on several processes every rank's keys enter the queue, in rank order",
    points=1,
    contract=(
        "Trained on several processes, each step enqueues the keys of the whole world batch — "
        "rank 0's, then rank 1's (gathered in rank order) — and every rank holds the same "
        "queue afterwards. A symmetric module enqueues both views' keys (2B per rank and step) "
        "in the order it enqueues them in one process: gathered together (each rank's keys of "
        "both views, rank by rank) or view by view (each view's keys of every rank)."
    ),
)


def _expected_blocks(ev: BuilderEvidence, t: int) -> tuple[list[list], list]:
    """The slots whose keys rank 0 may write at step ``t``, each a layout in rank order of
    each rank's positives (the keys its queries used, when their logits say so; else the key
    of each own image): for a symmetric module both views' keys, in the view order of its
    one-process enqueue (``enqueue_order``), gathered rank by rank (one gather of both views)
    or view by view (one gather per view); the rank-by-rank layout first; and every rank's
    keys of its own images in rank order. Then rank 0's own share alone (what it writes when
    nothing is gathered)."""
    ranks = ev.ranks
    fit = ev.judged_logits if ev.judged_logits.all_match else None
    views = ev.enqueue_order if ev.variant == SYMMETRIC else ranks.key_views
    entries = {}
    for rank in range(ranks.world):
        halves = ranks.positives(t, rank, fit.form, fit.temperature) if fit else []
        used = {half.key_view: half.used for half in halves}
        for view in views:
            keys = used.get(view, [])
            entries[rank, view] = [
                (view, image) if i >= len(keys) or keys[i] is None else keys[i].slot
                for i, image in enumerate(ranks.rows_of(rank))]
    by_rank = [slot for rank in range(ranks.world) for view in views
               for slot in entries[rank, view]]
    by_view = [slot for view in views for rank in range(ranks.world)
               for slot in entries[rank, view]]
    mine = [slot for view in views for slot in entries[0, view]]
    # each rank's keys of its own images, in rank order: a FIFO of the world batch whatever
    # the queries paired them with (a wrong pairing is I8-positive-across-ranks')
    natural = [(view, image) for rank in range(ranks.world) for view in views
               for image in ranks.rows_of(rank)]
    layouts = [by_rank] if by_view == by_rank else [by_rank, by_view]
    return layouts + ([natural] if natural not in layouts else []), mine


def _one(ranks, slots: list, i: int) -> str:
    """The ``i``-th entry named with its view (a query enqueued for a key shows as such)."""
    if i >= len(slots):
        return "nothing"
    slot = slots[i]
    if slot is None:
        return "no key"
    view, _ = slot if isinstance(slot, tuple) else (KEY_VIEW, slot)
    return f"{ranks.describe(slot)} ({VIEW_NAMES[view]}'s {'key' if view == KEY_VIEW else 'row'})"


def _who(ranks, slots: list) -> str:
    shown = [("no key" if slot is None else ranks.describe(slot)) for slot in slots[:6]]
    return ", ".join(shown) + (f", … ({len(slots)} columns)" if len(slots) > 6 else "")


@KEYS_OF_ALL_RANKS.judges('builder')
def i3_keys_of_all_ranks_builder(ev: BuilderEvidence) -> str | None:
    """In the two-process run (gloo, the module kept in step as ``DistributedDataParallel``
    does), rank 0's buffer receives at every step the entries of rank 0's images and then
    those of rank 1's, from its pointer on (a symmetric module: both views' keys of each, as
    ``_expected_blocks`` lays them out), and after every forward both ranks' buffers are
    equal. A module that exchanges nothing across ranks (a single-process module) is not
    judged."""
    if _never_written(ev):
        raise NotJudged("I3-fifo-keeps-newest", "the queue is never written in the one-process "
                                                "run, so no rank's keys can enter it")
    ranks = ev.ranks
    B = ranks.probe.batch
    per_rank = len(ranks.key_views) * B  # keys each rank contributes per step
    steps = range(ranks.steps)
    written = [ranks.written(t, 0) for t in steps]
    own = all(image in ranks.rows_of(0) for _, slots in written for _, image in slots)
    if own and not ranks.shuffled_across_ranks():
        raise NotRequired("does not apply: no data crossed the ranks (a single-process module: "
                          "each process keeps a queue of its own keys)")
    for t in steps:
        columns, slots = written[t]
        blocks, mine = _expected_blocks(ev, t)
        if slots in blocks:
            continue
        expected = blocks[0]
        where = f"at step {t} of the two-process run ({ranks.world} × {B} images)"
        if slots == mine or own and len(slots) == per_rank:
            fail("keys are not gathered across ranks before the enqueue: each rank enqueues "
                 "only its own keys", where=where,
                 expected=f"{ranks.world * per_rank} keys enqueued on rank 0 (rank 0's, then "
                          "rank 1's)",
                 got=f"{len(slots)}: {_who(ranks, slots)}")
        by_rank = [-1 if slot is None else slot[1] // B for slot in slots]
        swapped = len(slots) == len(expected) and by_rank == sorted(by_rank, reverse=True) \
            and by_rank != sorted(by_rank)
        first = next((i for i, (a, b) in enumerate(zip(expected, slots)) if a != b),
                     min(len(expected), len(slots)))
        fail("the keys are gathered out of rank order" if swapped
             else "rank 0's queue did not receive the world batch's keys in rank order",
             where=f"{where}, buffer columns {fmt_ids(columns)}",
             expected=f"{len(expected)} keys: {_who(ranks, expected)}",
             got=f"{len(slots)}: {_who(ranks, slots)}; the first that differs, the "
                 f"{first + 1}th: {_one(ranks, slots, first)} where "
                 f"{_one(ranks, expected, first)} belongs")
    for t in steps:
        queues = [ranks.rank_step(t, r).queue_after for r in range(ranks.world)]
        for r in range(1, ranks.world):
            differ = (queues[r] - queues[0]).abs().amax(dim=1) > 1e-6
            if bool(differ.any()):
                fail("the ranks' queues diverged: the ranks enqueued different keys",
                     where=f"after step {t} of the two-process run",
                     expected="the same buffer on every rank",
                     got=f"rank {r}'s differs from rank 0's in columns "
                         f"{fmt_ids(differ.nonzero().flatten())}")
    both = " (both views' keys)" if ev.variant == SYMMETRIC else ""
    return f"{ranks.world} processes: {ranks.world * per_rank} keys per step{both}, in rank order"
