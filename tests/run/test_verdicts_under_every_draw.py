"""A verdict never depends on the course's secret: every bundled example, graded under secrets
whose draws reach each extreme of the probe (the builder's batch 8 and 16, its K at 6 and 8
batches, each dim a course can draw; the LAB's 3 and 4 epochs and the smallest and largest
image and training-set counts among many secrets), gets the same verdict, passed or failed,
and the same failed families, as the manifest says (slow: the whole corpus, four times)."""

from __future__ import annotations

import pytest

from moco_ref.probe.builder import BATCH_CHOICES, DIM_CHOICES, default_builder_probe
from moco_ref.probe.cases import default_lab_probe
from moco_ref.probe.options import GradeOptions, probe_key_of
from moco_ref.report.scoring import failed_families
from moco_ref.run.demo import find_manifest, load_manifest, run_demo

CANDIDATES = [f"course {i}" for i in range(400)]


def _features(secret: str) -> set[tuple[str, object]]:
    key = probe_key_of(secret)
    builder = default_builder_probe(GradeOptions(probe_key=key))
    lab = default_lab_probe(0, key)
    return {("batch", builder.batch), ("dim", builder.dim),
            ("K per batch", builder.K // builder.batch), ("epochs", lab.epochs),
            ("images", lab.n_images), ("train", lab.n_train)}


def extreme_secrets() -> list[str]:
    """Few secrets whose draws, together, reach every extreme (greedy cover)."""
    drawn = {secret: _features(secret) for secret in CANDIDATES}
    values = {name: sorted({v for f in drawn.values() for n, v in f if n == name})
              for name in ("images", "train")}
    wanted = ({("batch", b) for b in BATCH_CHOICES} | {("dim", d) for d in DIM_CHOICES}
              | {("K per batch", 6), ("K per batch", 8), ("epochs", 3), ("epochs", 4)}
              | {(name, values[name][0]) for name in values}
              | {(name, values[name][-1]) for name in values})
    chosen: list[str] = []
    while wanted:
        best = max(CANDIDATES, key=lambda s: len(drawn[s] & wanted))
        assert drawn[best] & wanted, f"no secret draws {sorted(wanted)}"
        chosen.append(best)
        wanted -= drawn[best]
    return chosen


def test_the_chosen_secrets_reach_every_extreme_of_the_draw():
    chosen = extreme_secrets()
    reached = set().union(*(_features(s) for s in chosen))
    assert {("batch", 8), ("batch", 16), ("K per batch", 6), ("K per batch", 8),
            ("epochs", 3), ("epochs", 4)} <= reached
    assert {("dim", d) for d in DIM_CHOICES} <= reached
    assert len(chosen) <= 8


@pytest.mark.slow
def test_every_bundled_example_has_the_same_verdict_under_every_draw():
    examples = load_manifest(find_manifest())
    verdicts: dict[str, dict[str, tuple]] = {}
    surprises = []
    for secret in extreme_secrets():
        options = GradeOptions(probe_key=probe_key_of(secret))
        for outcome in run_demo(examples, options, jobs=2):
            name = outcome.example.path.name
            report = outcome.report
            verdicts.setdefault(name, {})[secret] = (report.gradable,
                                                     tuple(failed_families(report)))
            if not outcome.as_expected:
                surprises.append(f"{name} under {secret!r}: {outcome.actual_text}")
    assert surprises == []
    differing = {name: by_secret for name, by_secret in verdicts.items()
                 if len(set(by_secret.values())) > 1}
    assert differing == {}
