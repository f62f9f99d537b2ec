"""From the ``builder`` record's two-process run to what the across-ranks checks judge.

Each rank trained on its shard of one world batch (rank r: global rows ``r·B … (r+1)·B − 1``).
Every key-encoder forward was traced to global rows, so for every step the judge knows each
*candidate* key: the key encoder's output for a *slot* ``(view, image g)``, computed on
whichever rank ran it (shuffle-BN sends images to other ranks). An official-style module's keys
are of im_k only; a symmetric module's of both views (each view a query against the other
view's key, both returned pairs followed). From there:

- ``positives(t, r)``: for each returned pair of rank r, the view its queries are of and which
  candidate each query took as its positive, found from the returned positive logit under the
  form the one-process run was fitted to (``used_keys``: the pair of the official interface);
- ``written(t, r)``: which slot each buffer column rank r wrote at step t is a copy of.

Nothing the module reports is trusted: every value is recomputed from recorded tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch
import torch.nn.functional as F

from moco_ref.judge.assertions import (
    NotExercised,
    NotJudged,
    SubmissionCrashed,
    SubmissionError,
)
from moco_ref.judge.builder_record import BUILDER_INTERFACE, recorded_pointer
from moco_ref.judge.invariants.logits import StepLogits, canonical_logits, expected_logits
from moco_ref.judge.invariants.loss import LossForm
from moco_ref.probe.builder import KEY_VIEW, QUERY_VIEW, VIEW_NAMES, ranks_probe

MATCH_TOLERANCE = 1e-4  # relative: a copy of a key, a positive logit explained
PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer", "DistBackendError",
               "Gloo", "gloo")


Slot = tuple[int, int]  # (view, global image row): what a key is the key of


@dataclass(frozen=True)
class Candidate:
    """One key-encoder output row of a step: view ``view`` of image ``image`` (global row)
    computed on ``rank``."""

    image: int
    rank: int
    raw: torch.Tensor  # [dim] float64
    normalized: torch.Tensor  # [dim]
    view: int = KEY_VIEW
    # [dim] the row of its forward's output normalized over that batch (dim=0), as a module
    # that normalizes over the wrong dimension stores and uses it
    batch_normalized: torch.Tensor | None = None

    @property
    def slot(self) -> Slot:
        return (self.view, self.image)


@dataclass
class RankStep:
    rank: int
    index: int
    queries: dict[int, torch.Tensor]  # view -> [B, dim] float64 encoder_q's, own rows in order
    pairs: list[torch.Tensor]  # each returned pair's logits [B, 1 + K], in computation order
    queue_before: torch.Tensor  # [K, dim] one row per buffer column
    queue_after: torch.Tensor  # [K, dim]
    ptr_before: int | None

    @property
    def q(self) -> torch.Tensor:
        return self.queries[QUERY_VIEW]

    @property
    def logits(self) -> torch.Tensor:
        return self.pairs[0]


@dataclass(frozen=True)
class Half:
    """One returned pair of a rank step: its queries' view, the view their positives must come
    from, and the candidate each query's positive logit is (None: no candidate)."""

    query_view: int
    key_view: int
    used: list[Candidate | None]


def _row_shift(queries: torch.Tensor, logits: torch.Tensor, form: LossForm,
               temperature: float, queues: list[tuple[torch.Tensor, torch.Tensor]]
               ) -> torch.Tensor:
    """``[B]``: the constant each row of the returned logits is shifted by (``logits -
    logits.max(1)`` leaves the cross-entropy as it is), read off the negatives against the
    first of ``queues`` (each a buffer before and after the forward) that explains them up
    to one constant per row; zeros when none does."""
    for before, after in queues:
        negatives = {"before": before, "after": after}
        if logits.ndim != 2 or form.negatives not in negatives or \
                logits.shape[1] != 1 + len(negatives[form.negatives]):
            continue
        reference = expected_logits(form, StepLogits(queries, queries, logits, negatives),
                                    temperature)
        gap = (canonical_logits(logits) - canonical_logits(reference))[:, 1:]  # [B, K]
        rowwise = gap.median(dim=1).values
        if bool(((gap - rowwise[:, None]).abs() <= MATCH_TOLERANCE * max(
                1.0, float(reference.abs().max()))).all()):
            return rowwise
    return torch.zeros(len(queries), dtype=torch.float64)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= MATCH_TOLERANCE * max(
        1.0, float(b.abs().max()))


class RanksEvidence:
    """The two-process run of a ``builder`` module, as the across-ranks checks read it."""

    def __init__(self, record: dict, probe, *, symmetric: bool = False) -> None:
        self.probe = ranks_probe(probe, symmetric=symmetric)
        self.symmetric = symmetric
        # the views whose keys a step computes and enqueues, and whose queries it has
        self.key_views = (QUERY_VIEW, KEY_VIEW) if symmetric else (KEY_VIEW,)
        self.query_views = (QUERY_VIEW, KEY_VIEW) if symmetric else (QUERY_VIEW,)
        self._record = record
        self._rank_steps: dict[tuple[int, int], RankStep] = {}  # read once, asked often
        self._candidates: dict[int, list[Candidate]] = {}

    @property
    def world(self) -> int:
        return self.probe.ranks

    def rows_of(self, rank: int) -> range:
        """The global rows of ``rank``'s shard of the world batch."""
        return range(rank * self.probe.batch, (rank + 1) * self.probe.batch)

    def describe(self, slot: Slot | int) -> str:
        """``image 3 of rank 1`` (a symmetric module's slots name the view: ``(im_q)``)."""
        view, image = slot if isinstance(slot, tuple) else (KEY_VIEW, slot)
        rank, row = divmod(image, self.probe.batch)
        return f"image {row} of rank {rank}" + (f" ({VIEW_NAMES[view]})" if self.symmetric
                                                else "")

    def slot_of_query(self, view: int, image: int) -> Slot:
        """The slot a query of ``view`` takes when a module enqueues it in place of a key: a
        symmetric module's q of a view stands where the key of that view goes; the official
        module's (of im_q) where the key of its image (of im_k) goes."""
        return (view, image) if self.symmetric else (KEY_VIEW, image)

    # ----------------------------------------------------------------- runs

    @cached_property
    def runs(self) -> list[dict]:
        """Both ranks' runs; raises when the two-process run was not made or a rank raised."""
        ranks = self._record.get("ranks")
        if not isinstance(ranks, dict):
            group = self._record.get("environment", {}).get("process_group")
            raise NotExercised(f"not judged: the two-process run was not made (the "
                               f"one-process group was {group!r})")
        runs = ranks.get("runs") or []
        failed = [(r, run) for r, run in enumerate(runs) if run.get("error")]
        if failed:
            own = [(r, run) for r, run in failed
                   if not any(word in str(run["error"]) for word in PEER_ERRORS)]
            rank, run = (own or failed)[0]
            raise self._crash(f"raised on rank {rank} at {run.get('stage')}", str(run["error"]))
        if ranks.get("error") or len(runs) != self.world:
            why = ranks.get("error") or f"{len(runs)} of {self.world} ranks sent a run"
            raise self._crash("did not finish", str(why))
        return runs

    def _crash(self, what: str, text: str) -> SubmissionCrashed:
        """The two-process run's one root cause, told by the first across-ranks check."""
        p = self.probe
        return SubmissionCrashed(
            "ranks", f"trained on {self.world} processes (gloo, {p.batch} images per rank, "
                     f"K = {p.K}), the module {what} although it trains in one process", text)

    @cached_property
    def steps(self) -> int:
        counts = {len(run.get("steps", [])) for run in self.runs}
        if counts != {self.probe.steps}:
            raise SubmissionError(f"the two-process run recorded {sorted(counts)} steps, "
                                  f"not {self.probe.steps}")
        return self.probe.steps

    def _columns(self, queue) -> torch.Tensor:
        p = self.probe
        if not isinstance(queue, torch.Tensor) or not queue.is_floating_point():
            raise NotJudged(BUILDER_INTERFACE,
                            "in the two-process run the module has no float queue buffer")
        queue = queue.to(torch.float64)
        if list(queue.shape) == [p.dim, p.K]:
            return queue.T
        if list(queue.shape) == [p.K, p.dim]:
            return queue
        raise NotJudged(BUILDER_INTERFACE, f"in the two-process run the queue has shape "
                                           f"{list(queue.shape)}, not [dim, K] = [{p.dim}, {p.K}]")

    def rank_step(self, t: int, rank: int) -> RankStep:
        if (t, rank) not in self._rank_steps:
            self._rank_steps[t, rank] = self._read_rank_step(t, rank)
        return self._rank_steps[t, rank]

    def _read_rank_step(self, t: int, rank: int) -> RankStep:
        record = self.runs[rank]["steps"][t]
        rows = list(self.rows_of(rank))
        queries = {view: self._queries(record, t, rank, view) for view in self.query_views}
        if self.symmetric:
            pairs = [pair.get("logits") for pair in record.get("pairs") or []]
            if len(pairs) != 2:
                raise SubmissionError(
                    f"at step {t} of the two-process run rank {rank}'s forward gave "
                    f"{len(pairs) or 'one'} (logits, labels) pair(s), not the two of the "
                    "one-process run (a symmetric module)")
        else:
            pairs = [record["logits"]]
        for logits in pairs:
            if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or len(logits) != len(
                    rows):
                raise SubmissionError(f"at step {t} of the two-process run rank {rank} returned "
                                      f"logits of shape {list(getattr(logits, 'shape', []))}, "
                                      f"not [{len(rows)}, 1 + K]")
        return RankStep(rank, t, queries, [logits.to(torch.float64) for logits in pairs],
                        self._columns(record["before"].get("queue")),
                        self._columns(record["after_forward"].get("queue")),
                        recorded_pointer(record["before"].get("queue_ptr")))

    def _queries(self, record: dict, t: int, rank: int, view: int) -> torch.Tensor:
        """encoder_q's output on ``view`` of this rank's own rows ``[B, dim]``, in row order."""
        rows = list(self.rows_of(rank))
        for event in record["events"]:
            mine = event["views"] == view  # a forward may run on both views at once
            if event["role"] != "q" or event["output"].ndim != 2 or not bool(mine.any()):
                continue
            seen, output = event["rows"][mine], event["output"][mine]
            if sorted(seen.tolist()) == rows and len(output) == len(rows):
                q = torch.empty_like(output, dtype=torch.float64)
                q[seen - rows[0]] = output.to(torch.float64)
                return q
        raise SubmissionError(f"at step {t} of the two-process run encoder_q of rank {rank} "
                              f"did not run once on that rank's {VIEW_NAMES[view]}")

    def candidates(self, t: int) -> list[Candidate]:
        """Every key-encoder output row of step ``t`` on any rank, traced to its image."""
        if t not in self._candidates:
            self._candidates[t] = self._read_candidates(t)
        return self._candidates[t]

    def _read_candidates(self, t: int) -> list[Candidate]:
        found = []
        for rank, run in enumerate(self.runs):
            for event in run["steps"][t]["events"]:
                if event["role"] != "k":
                    continue
                output = event["output"].to(torch.float64)
                if output.ndim != 2 or output.shape[1] != self.probe.dim:
                    continue  # not a key of this probe's width: no candidate
                over_batch = F.normalize(output, dim=0)
                for view, image, raw, batch_row in zip(event["views"].tolist(),
                                                       event["rows"].tolist(), output, over_batch):
                    if view in self.key_views and image >= 0:
                        found.append(Candidate(image, rank, raw, F.normalize(raw, dim=0), view,
                                               batch_row))
        return found

    def shuffled_across_ranks(self) -> bool:
        """Whether some rank's key encoder ran on another rank's images."""
        return any(c.image not in self.rows_of(c.rank)
                   for t in range(self.steps) for c in self.candidates(t))

    def partitioned(self, t: int) -> bool:
        """Whether the key encoders of all ranks together ran on each image exactly once (of
        each view whose keys the module computes)."""
        slots = sorted(c.slot for c in self.candidates(t))
        return slots == [(view, image) for view in self.key_views
                         for image in range(self.world * self.probe.batch)]

    # ----------------------------------------------------------------- positives

    def used_keys(self, t: int, rank: int, form: LossForm, temperature: float
                  ) -> list[Candidate | None]:
        """For each query of ``rank`` at step ``t`` (the official interface's one pair): the
        candidate whose positive logit under ``form`` is the one returned (None when none is)."""
        return self.positives(t, rank, form, temperature)[0].used

    def positives(self, t: int, rank: int, form: LossForm, temperature: float) -> list[Half]:
        """Each returned pair of ``rank`` at step ``t``, with the candidate each of its queries
        took as its positive. A symmetric module's two pairs are matched to the two views'
        queries as the one-process run matches them: the assignment (straight, or swapped)
        whose positives are explained by more candidates, then by more keys of the other view
        of the query's own image; im_q's queries first when both explain alike."""
        step = self.rank_step(t, rank)
        rows = list(self.rows_of(rank))
        if not self.symmetric:
            return [Half(QUERY_VIEW, KEY_VIEW,
                         self._used(t, step.q, step.logits, form, temperature, step,
                                    own=[(KEY_VIEW, image) for image in rows]))]
        used = {(p, v): self._used(t, step.queries[v], logits, form, temperature, step,
                                   own=[(1 - v, image) for image in rows])
                for p, logits in enumerate(step.pairs) for v in self.query_views}

        def score(first: int) -> tuple[int, int]:
            halves = [(0, first), (1, 1 - first)]
            found = [key for half in halves for key in used[half]]
            right = sum(key is not None and key.slot == (1 - v, image)
                        for p, v in halves for key, image in zip(used[p, v], rows))
            return sum(key is not None for key in found), right

        first = KEY_VIEW if score(KEY_VIEW) > score(QUERY_VIEW) else QUERY_VIEW
        return [Half(v, 1 - v, used[p, v]) for p, v in ((0, first), (1, 1 - first))]

    def _used(self, t: int, queries: torch.Tensor, logits: torch.Tensor, form: LossForm,
              temperature: float, step: RankStep | None = None,
              own: list | None = None) -> list[Candidate | None]:
        """The candidate key each query's positive logit is q·k of: the closest within
        ``MATCH_TOLERANCE``, or the query's ``own`` slot's key whenever it is within it too
        (two views of one image can give keys whose logits agree to that tolerance)."""
        candidates = self.candidates(t)
        queues = [] if step is None else [  # the rank's own, and rank 0's broadcast buffer
            (other.queue_before, other.queue_after)
            for other in (step, self.rank_step(t, 0))]
        shift = _row_shift(queries, logits, form, temperature, queues)
        if not candidates:
            raise SubmissionError(f"at step {t} of the two-process run no key-encoder forward "
                                  "ran on an image of the world batch")
        if form.normalize == "k-batch":  # each key as normalized within its own forward
            keys = torch.stack([c.batch_normalized for c in candidates])  # [n, dim]
            form = replace(form, normalize="k-raw")
        else:
            keys = torch.stack([c.raw for c in candidates])  # [n, dim]
        used = []
        for i in range(len(queries)):
            query = queries[i].expand_as(keys)
            expected = expected_logits(form, StepLogits(query, keys, keys[:, :1],
                                                        {"before": keys[:1], "after": keys[:1]}),
                                       temperature)[:, 0]  # [n]
            errors = (expected - (logits[i, 0] - shift[i])).abs() / max(
                1.0, float(expected.abs().max()))
            best = int(errors.argmin())
            mine = [c for c, candidate in enumerate(candidates)
                    if own is not None and i < len(own) and candidate.slot == own[i]]
            if mine and float(errors[mine[0]]) <= MATCH_TOLERANCE:
                best = mine[0]
            used.append(candidates[best] if float(errors[best]) <= MATCH_TOLERANCE else None)
        return used

    # ----------------------------------------------------------------- the queue

    def written(self, t: int, rank: int) -> tuple[list[int], list[Slot]]:
        """The buffer columns of ``rank`` that hold an entry of step ``t`` after its forward,
        in reading order, and the slot of each: a column is an entry of the step when it is
        a copy of a vector computed at the step — a key or a query, normalized or raw (which
        kind belongs in the queue is I2's business; a query stands for the slot of
        ``slot_of_query``). The entries are read from the pointer when it marks one of them,
        else from the start of their run of columns (a buffer that shifts instead of
        overwriting puts them at one end)."""
        step = self.rank_step(t, rank)
        K = self.probe.K
        vectors = [(c.slot, v) for c in self.candidates(t)
                   for v in (c.normalized, c.raw, c.batch_normalized) if v is not None]
        for r in range(self.world):
            for view, query in self.rank_step(t, r).queries.items():
                vectors += [(self.slot_of_query(view, image), v)
                            for image, row in zip(self.rows_of(r), query)
                            for v in (F.normalize(row, dim=0), row)]
        found = {}
        for j in range(K):
            slot = next((slot for slot, v in vectors if _close(step.queue_after[j], v)), None)
            if slot is not None:
                found[j] = slot
        if step.ptr_before is not None and step.ptr_before % K in found:
            start = step.ptr_before % K
        else:
            start = min((j for j in found if (j - 1) % K not in found), default=0)
        columns = sorted(found, key=lambda j: (j - start) % K)
        return columns, [found[j] for j in columns]
