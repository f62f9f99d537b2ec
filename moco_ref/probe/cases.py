"""Hypothesis strategies of the harness, in one place: the ``lab`` probe's sizes and the cases
the ``components`` protocol is run through.

Each case is a small frozen dataclass of plain numbers; its tensors are *built* from it by a
deterministic function (a ``torch.Generator`` seeded from the case). So the observing side and
the judging side can each draw the same cases (``draw_cases`` under a fixed seed, database
off) and build the same inputs independently: the judge never reads inputs back from the
submission's process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from torch import nn

from moco_ref.probe.options import course_draw

# --------------------------------------------------------------------------- drawing


@contextmanager
def _without_local_constants() -> Iterator[None]:
    """Hypothesis seeds its generation with literal constants harvested from the *local*
    modules loaded in the process (``providers._get_local_constants``), so the same seed
    draws different cases in the submission's process and in the grader's. For the duration
    of a draw, only its built-in constants are used, whatever is loaded."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - another hypothesis layout: nothing to pin
        yield
        return
    original = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if original is None or cache is None or not hasattr(providers, "Constants"):
        yield  # pragma: no cover
        return
    empty = providers.Constants()
    cache.cache.clear()
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.cache.clear()


def draw_cases(strategy: st.SearchStrategy, count: int, seed: int) -> list:
    """The first ``count`` examples hypothesis generates from ``strategy`` under ``seed``.

    Deterministic for a given hypothesis version, whatever else the process has loaded: no
    database, no deadline, the default backend, generation only, and none of the constants
    hypothesis would otherwise borrow from local modules (see ``_without_local_constants``).
    """
    drawn: list = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        derandomize=False,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        backend="hypothesis",
    )
    @given(strategy)
    def collect(case) -> None:
        drawn.append(case)

    with _without_local_constants():
        collect()
    return drawn[:count]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


# --------------------------------------------------------------------------- lab probe


DIGITS = 1797  # the images of LAB 07's data set (scikit-learn's 8×8 digits)


@dataclass(frozen=True)
class LabProbe:
    """The ``lab`` probe's sizes: ``n_images`` images ``[1, 8, 8]`` (LAB 07's data: the 1797
    8×8 digits), of which ``n_train`` (a scattered subset over the whole index range, so ids
    are not positions) are the training set, for ``epochs`` epochs. With LAB 07's own settings
    (batch 60, capacity 240) 150 training images give batches 60, 60, 30 per epoch: the queue
    fills at step 4, wraps in the middle of a batch, and from the second epoch on every source
    id meets its own older keys in the queue."""

    n_images: int = DIGITS  # ids up to 1796: a dtype that cannot hold them (bfloat16) shows
    n_train: int = 150
    epochs: int = 3
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def max_view_calls(self) -> int:
        """The most ``views`` calls a run of this probe can make: two per batch of at least
        one image, every epoch, plus a few calls on the whole image set."""
        return 2 * self.epochs * self.n_train + 2 * self.epochs + 8

    @property
    def max_view_rows(self) -> int:
        """The most images all ``views`` calls of a run can hold together: every training
        image twice an epoch, and the whole set twice an epoch (views applied to ``x``)."""
        return 2 * self.epochs * (self.n_train + self.n_images) + self.n_images

    @classmethod
    def from_dict(cls, data: dict) -> LabProbe:
        return cls(**{name: int(data[name]) for name in ("n_images", "n_train", "epochs", "seed")})


def default_lab_probe(seed: int = 0, key: str = "") -> LabProbe:
    """The probe a run grades with. Without a course ``key`` it is the documented default;
    with one (``GradeOptions.probe_key``, derived from the course's secret) its training
    set's size, its epochs, ids and seed are drawn from the key and ``seed``: the same for
    every submission of the course and run, unknowable to a submission that wants to
    recognise the probe. The images are always as many as LAB 07's own. Every drawn probe
    keeps what the default is built for: a training set that fills a 240-key queue within
    the first epochs and wraps it in the middle of a batch, and sources that meet their own
    older keys."""
    if not key:
        return LabProbe(seed=int(seed))
    draw = course_draw("lab", key, seed)
    n_train = draw.randint(130, 175)
    return LabProbe(n_images=DIGITS, n_train=n_train, epochs=draw.randint(3, 4),
                    seed=draw.randint(0, 2**31 - 1))


SHORT_RUN_EPOCHS = 2
SHORT_RUN_TRAIN = (60, 65)  # [low, high): at most half a 128-key queue, a batch of 60 or 64


def short_lab_probe(probe: LabProbe) -> LabProbe:
    """The second, short run's probe, derived from the main one (the same images' count,
    another seed): ``SHORT_RUN_TRAIN`` training ids for ``SHORT_RUN_EPOCHS`` epochs. The main
    probe's training set fills a typical queue (128 or 240 keys) before any id repeats; here
    the ids repeat while the queue still has empty slots (the second epoch's queries meet their
    own first-epoch keys) — at most half of a 128-key queue is written then — and the run ends
    before a 240-key queue is full, so the paths of a ring that is not yet full are met: its
    mask over unwritten slots, its returned queue. LAB 07's batch of 60 still gives a full
    batch (a ``drop_last`` loop trains too)."""
    low, high = SHORT_RUN_TRAIN
    return LabProbe(n_images=probe.n_images, n_train=low + probe.seed % (high - low),
                    epochs=SHORT_RUN_EPOCHS, seed=(probe.seed + 1) % 2**31)


@st.composite
def lab_probes(draw) -> LabProbe:
    """Probes around the default: ragged batch counts, 3–4 epochs, any seed."""
    n_train = draw(st.sampled_from([150, 130, 170, 149]))
    return LabProbe(
        n_images=n_train + draw(st.integers(10, 60)),
        n_train=n_train,
        epochs=draw(st.integers(3, 4)),
        seed=draw(st.integers(0, 2**16)),
    )


# --------------------------------------------------------------------------- components


def arrival_numbers(batch_sizes) -> list[torch.Tensor]:
    """``[0 .. B0), [B0 .. B0+B1), …``: the arrival number of every key, batch by batch (the
    one numbering the probes write and the judge reads)."""
    total = int(sum(batch_sizes))
    return list(torch.arange(total, dtype=torch.int64).split([int(b) for b in batch_sizes]))


@dataclass(frozen=True)
class QueueCase:
    """A queue of ``capacity`` slots of ``dim``-vectors receiving batches of ``batch_sizes``
    (some larger than the capacity, most not dividing it) with ids from a small pool."""

    capacity: int
    dim: int
    batch_sizes: tuple[int, ...]
    id_pool: int
    seed: int

    SCRIBBLE = 1000  # what the observer adds to the caller's keys and ids after each enqueue

    def batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``[(keys [B, dim] float64, ids [B] int64), ...]``; every key value is distinct and
        column 0 holds the key's arrival number + 1, exactly."""
        generator = _generator(self.seed)
        total = sum(self.batch_sizes)
        keys = torch.randn(total, self.dim, generator=generator, dtype=torch.float64)
        keys[:, 0] = torch.cat(self.arrivals()).to(torch.float64) + 1.0
        ids = torch.randint(0, self.id_pool, (total,), generator=generator)
        return list(zip(keys.split(list(self.batch_sizes)), ids.split(list(self.batch_sizes))))

    def arrivals(self) -> list[torch.Tensor]:
        """``[B]`` arrival numbers of each batch's keys (0, 1, … over the whole case)."""
        return arrival_numbers(self.batch_sizes)

    @classmethod
    def arrivals_of(cls, stored: torch.Tensor) -> torch.Tensor:
        """``[n]`` arrival numbers of stored rows, read back from column 0 (a queue that kept a
        reference to the caller's tensor shows the scribble too); −1 where a row holds no exact
        arrival number."""
        if stored.ndim != 2 or stored.shape[0] == 0:
            return torch.empty(0, dtype=torch.int64)
        first = stored[:, 0]
        first = torch.where(first > cls.SCRIBBLE, first - cls.SCRIBBLE, first)
        exact = first == first.round()
        unknown = torch.full_like(first, -1, dtype=torch.int64)
        return torch.where(exact, first.round().to(torch.int64) - 1, unknown)


@st.composite
def queue_cases(draw) -> QueueCase:
    capacity = draw(st.one_of(st.sampled_from([1, 4, 5]), st.integers(1, 9)))
    sizes = draw(st.lists(st.integers(1, 2 * capacity + 1), min_size=1, max_size=6))
    return QueueCase(
        capacity=capacity,
        dim=draw(st.integers(1, 3)),
        batch_sizes=tuple(sizes),
        id_pool=draw(st.integers(1, 6)),
        seed=draw(st.integers(0, 2**16)),
    )


def _tiny_model(generator: torch.Generator, sizes: tuple[int, int, int]) -> nn.Module:
    """Linear → BatchNorm1d → Linear in float64, every parameter and buffer drawn."""
    first, hidden, last = sizes
    model = nn.Sequential(nn.Linear(first, hidden), nn.BatchNorm1d(hidden), nn.Linear(hidden, last))
    model = model.to(torch.float64)
    with torch.no_grad():
        for tensor in list(model.parameters()) + [model[1].running_mean, model[1].running_var]:
            tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=torch.float64))
        model[1].running_var.abs_()
    return model


@dataclass(frozen=True)
class EmaCase:
    """``momentum_update(key, query, m)`` on two float64 models of ``sizes`` that differ in
    every parameter and buffer."""

    sizes: tuple[int, int, int]
    m: float
    seed: int

    def models(self) -> tuple[nn.Module, nn.Module]:
        """``(key_model, query_model)``, freshly built."""
        generator = _generator(self.seed)
        key = _tiny_model(generator, self.sizes)
        query = _tiny_model(generator, self.sizes)
        for param in key.parameters():
            param.requires_grad_(False)
        return key, query


@st.composite
def ema_cases(draw) -> EmaCase:
    m = draw(st.one_of(st.sampled_from([0.0, 0.5, 0.9, 0.95, 0.999, 1.0]), st.floats(0.0, 1.0)))
    sizes = (draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    return EmaCase(sizes=sizes, m=float(m), seed=draw(st.integers(0, 2**16)))


@dataclass(frozen=True)
class LogitsCase:
    """``contrastive_logits`` on ``batch`` unit queries and keys, a queue of ``queue_len``
    unit keys, ids from a pool of ``id_pool`` (so sources collide), temperature ``T``."""

    batch: int
    queue_len: int
    dim: int
    id_pool: int
    temperature: float
    seed: int

    def tensors(self) -> dict[str, torch.Tensor]:
        """``q [B, d]``, ``k [B, d]``, ``queue_keys [n, d]``, ``queue_ids [n]``, ``ids [B]``."""
        generator = _generator(self.seed)

        def unit(rows: int) -> torch.Tensor:
            x = torch.randn(rows, self.dim, generator=generator, dtype=torch.float64)
            return torch.nn.functional.normalize(x, dim=1)

        q, k, queue_keys = unit(self.batch), unit(self.batch), unit(self.queue_len)
        ids = torch.randperm(self.id_pool, generator=generator)[: self.batch]
        queue_ids = torch.randint(0, self.id_pool, (self.queue_len,), generator=generator)
        return {"q": q, "k": k, "queue_keys": queue_keys, "queue_ids": queue_ids, "ids": ids}


@st.composite
def logits_cases(draw) -> LogitsCase:
    batch = draw(st.integers(1, 5))
    return LogitsCase(
        batch=batch,
        queue_len=draw(st.integers(0, 8)),
        dim=draw(st.integers(1, 4)),
        id_pool=draw(st.integers(batch, batch + 4)),
        temperature=float(draw(st.sampled_from([0.07, 0.1, 0.2, 0.5, 1.0, 2.0]))),
        seed=draw(st.integers(0, 2**16)),
    )


@dataclass(frozen=True)
class LossCase:
    """``info_nce_loss`` on ``[batch, columns]`` logits, some entries −inf (never a label's),
    with explicit labels or the default (column 0)."""

    batch: int
    columns: int
    explicit_labels: bool
    seed: int

    def tensors(self) -> dict[str, torch.Tensor | None]:
        """``logits [B, C]`` float64 and ``labels [B]`` int64 or None."""
        generator = _generator(self.seed)
        shape = (self.batch, self.columns)
        logits = 3.0 * torch.randn(shape, generator=generator, dtype=torch.float64)
        labels = torch.randint(0, self.columns, (self.batch,), generator=generator)
        if not self.explicit_labels:
            labels = torch.zeros(self.batch, dtype=torch.int64)
        masked = torch.rand(self.batch, self.columns, generator=generator) < 0.3
        masked[torch.arange(self.batch), labels] = False
        logits = logits.masked_fill(masked, float("-inf"))
        return {"logits": logits, "labels": labels if self.explicit_labels else None}


@st.composite
def loss_cases(draw) -> LossCase:
    return LossCase(
        batch=draw(st.integers(1, 5)),
        columns=draw(st.integers(1, 7)),
        explicit_labels=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


# Corners every components submission meets first, whatever hypothesis draws after them:
# a wrap in the middle of a batch, a batch larger than the queue, LAB 07's momentum, a queue
# full of same-source keys, an empty queue, a masked entry beside every label.
PINNED_CASES = {
    "queue": (
        QueueCase(capacity=4, dim=2, batch_sizes=(3, 3, 3), id_pool=3, seed=1),
        QueueCase(capacity=4, dim=1, batch_sizes=(2, 6, 1), id_pool=5, seed=2),
        QueueCase(capacity=5, dim=2, batch_sizes=(2, 2, 2, 2, 2), id_pool=2, seed=3),
    ),
    "ema": (
        EmaCase(sizes=(3, 2, 2), m=0.95, seed=1),
        EmaCase(sizes=(2, 3, 1), m=0.0, seed=2),
        EmaCase(sizes=(1, 2, 3), m=1.0, seed=3),
    ),
    "logits": (
        LogitsCase(batch=3, queue_len=6, dim=2, id_pool=3, temperature=0.2, seed=1),
        LogitsCase(batch=2, queue_len=0, dim=3, id_pool=4, temperature=0.07, seed=2),
        LogitsCase(batch=4, queue_len=8, dim=2, id_pool=4, temperature=0.5, seed=3),
    ),
    "loss": (
        LossCase(batch=3, columns=5, explicit_labels=False, seed=1),
        LossCase(batch=4, columns=4, explicit_labels=True, seed=2),
        LossCase(batch=2, columns=1, explicit_labels=False, seed=3),
    ),
}

# How many cases of each kind a components submission is run through (observe and judge).
COMPONENT_CASE_COUNTS = {"queue": 25, "ema": 20, "logits": 25, "loss": 20}
COMPONENT_STRATEGIES = {
    "queue": queue_cases(),
    "ema": ema_cases(),
    "logits": logits_cases(),
    "loss": loss_cases(),
}


def cases_fingerprint(cases) -> str:
    """A short digest of drawn cases: the observing and the judging side compare theirs, so a
    difference in drawing (another hypothesis version) is reported, never misjudged."""
    return hashlib.sha256(repr(tuple(cases)).encode()).hexdigest()[:16]


@lru_cache(maxsize=32)
def component_cases(kind: str, seed: int) -> tuple:
    """The deterministic cases of ``kind`` ("queue", "ema", "logits", "loss") for ``seed``:
    the pinned corners, then distinct drawn cases, ``COMPONENT_CASE_COUNTS[kind]`` in all."""
    cases = list(PINNED_CASES[kind])
    for case in draw_cases(COMPONENT_STRATEGIES[kind], COMPONENT_CASE_COUNTS[kind] + 10, seed):
        if case not in cases:
            cases.append(case)
    return tuple(cases[: COMPONENT_CASE_COUNTS[kind]])
