"""A verdict never depends on the course's probe draw: the same module gets the same verdict
whichever dim the course secret draws (12, 28, 36). A bottleneck MoCo v2 head holds fewer
parameters than the plain fc it replaces at some dims: judged by its layers, it is kept at
every draw, and a module whose mlp=True adds no layer fails at every draw."""

from __future__ import annotations

from pathlib import Path

import pytest

from moco_ref.judge.judge import judge
from moco_ref.judge.results import Status
from moco_ref.observe.observers import observe
from moco_ref.probe.builder import DIM_CHOICES, default_builder_probe
from moco_ref.probe.options import GradeOptions, probe_key_of
from tests.helpers.conformance_support import load_namespace

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "submissions"
# secrets whose draws are each of the dims a course can meet (checked below, not assumed)
SECRETS = {28: "course 0", 12: "course 4", 36: "course 1"}


def test_the_secrets_cover_every_dim_a_course_can_draw():
    drawn = {default_builder_probe(GradeOptions(probe_key=probe_key_of(s))).dim: d
             for d, s in SECRETS.items()}
    assert sorted(drawn) == sorted(DIM_CHOICES) and all(k == v for k, v in drawn.items())


def _mlp_verdict(name: str, secret: str) -> tuple[Status, str]:
    options = GradeOptions(style="builder", probe_key=probe_key_of(secret),
                           checks=("contract-builder-mlp",))
    observations = observe(load_namespace(EXAMPLES / name), "builder", options)
    results, _ = judge(observations, "builder", options)
    (result,) = [r for r in results if r.check_id == "contract-builder-mlp"]
    return result.status, result.message


@pytest.mark.parametrize("dim", sorted(SECRETS))
def test_a_bottleneck_head_is_kept_at_every_draw(dim):
    status, message = _mlp_verdict("builder_correct_bottleneck_head.py", SECRETS[dim])
    assert status is Status.PASSED, message
    assert message == "2 Linear layer(s) added to the head"


@pytest.mark.parametrize("dim", sorted(SECRETS))
def test_a_head_on_one_encoder_only_fails_at_every_draw(dim):
    status, message = _mlp_verdict("builder_bug_mlp_query_only.py", SECRETS[dim])
    assert status is Status.FAILED, message
