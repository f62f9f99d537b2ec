"""How a builder queue's columns are told in I3's messages: each column labelled by what it
holds (a starting entry 0…K−1, or the key of step t, row r: K + t·B + r, as
``invariants.buffer`` labels them), read back as step ranges and runs."""

from __future__ import annotations

import torch

from moco_ref.judge.assertions import SubmissionError, fmt_ids, fmt_range
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.checks.common import builder_where
from moco_ref.judge.invariants.buffer import UNKNOWN


def describe_labels(ev: BuilderEvidence, labels) -> str:
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


def describe_order(ev: BuilderEvidence, labels) -> str:
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
    shown = ", then ".join(describe_labels(ev, run) for run in runs[:4])
    return shown + (f", then {len(runs) - 4} more runs" if len(runs) > 4 else "")


def step_runs(ev: BuilderEvidence, labels) -> list[int]:
    """Each column's label, one step's keys all labelled by their step: the order of a
    builder queue's columns up to the order of one key batch among itself (a module keeps no
    ids, so that order changes no negative; which key a query was paired with is I8's)."""
    K, B = ev.probe.K, ev.probe.batch
    return [v if v < K else K + (v - K) // B * B for v in (int(v) for v in labels)]


def traced(ev: BuilderEvidence, step) -> torch.Tensor:
    trace = ev.columns[step.index]
    unknown = [j for j, kind in enumerate(trace.kinds) if kind == UNKNOWN]
    if unknown:
        raise SubmissionError(
            f"{builder_where(step.index, after=True)} buffer columns {fmt_ids(unknown)} are "
            "copies of no "
            "recorded key, so the FIFO cannot be followed (see I2-entries-are-arrival-keys)")
    return trace.labels
