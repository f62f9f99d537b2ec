"""The style and the probe are the grader's: the style is read from the source (or pinned),
and a course's probe is drawn from its secret, so a submission can neither choose how it is
graded nor recognise the probe by its documented shapes."""

from __future__ import annotations

import pytest

from moco_ref.probe.builder import WIDTH, default_builder_probe, ragged_probe
from moco_ref.probe.cases import default_lab_probe
from moco_ref.probe.options import GradeOptions, probe_key_of
from moco_ref.run.pipeline import style_decided

LAB = "def train_moco(initial, x, train, epochs=15):\n    pass\n"
BUILDER = "class MoCo:\n    pass\n"


@pytest.mark.parametrize(("source", "pinned", "style", "says"), [
    (LAB + BUILDER + "del train_moco\n", None, "lab", "2 styles (lab, builder): graded as lab"),
    (BUILDER + LAB, "builder", "builder", "graded as builder, the course's style"),
    (BUILDER, None, "builder", ""),
    ("def info_nce_loss(q, k):\n    pass\n", None, "components", ""),
    ("from impl import *\n", None, None, ""),  # nothing bound: the namespace decides
])
def test_the_style_is_read_from_the_source(tmp_path, source, pinned, style, says):
    path = tmp_path / "s.py"
    path.write_text(source)
    options, note = style_decided(str(path), GradeOptions(style=pinned))
    assert options.style == style
    assert (says in note) if says else note == ""


def test_a_module_target_is_read_from_its_file_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / "course_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (package / "mine.py").write_text(BUILDER)
    monkeypatch.chdir(tmp_path)
    options, _ = style_decided("course_pkg.mine", GradeOptions())
    assert options.style == "builder"


def test_without_a_course_key_the_probe_is_the_documented_default():
    probe = default_lab_probe(0)  # the README's documented probe, its figures as written
    assert (probe.n_images, probe.n_train, probe.seed) == (1797, 150, 0)
    assert default_lab_probe(0, probe_key_of("a course")) != probe  # a secret moves it


KEYS = [probe_key_of(f"course {i}") for i in range(12)]


@pytest.mark.parametrize("key", KEYS)
def test_a_course_s_lab_probe_keeps_what_the_probe_is_built_for(key):
    probe = default_lab_probe(0, key)
    assert probe == default_lab_probe(0, key)  # reproducible from the secret
    assert probe.n_images == 1797  # LAB 07's own data: the digits (a gate on it sees the course)
    assert 3 * probe.n_train > 240 and probe.n_train < 240  # fills and wraps LAB 07's queue
    assert probe.epochs >= 3


def test_course_keys_give_different_lab_probes():
    shapes = {(default_lab_probe(0, key).n_train, default_lab_probe(0, key).epochs)
              for key in KEYS}
    assert len(shapes) > len(KEYS) // 2
    assert len({default_lab_probe(0, key).seed for key in KEYS}) == len(KEYS)


@pytest.mark.parametrize("key", KEYS)
def test_a_course_s_builder_probe_keeps_the_official_module_s_assumptions(key):
    probe = default_builder_probe(GradeOptions(probe_key=key))
    assert probe.K % probe.batch == 0 and probe.steps * probe.batch > probe.K
    ragged = ragged_probe(probe)
    assert ragged.K % ragged.batch != 0 and ragged.steps * ragged.batch > ragged.K
    assert probe.dim != WIDTH  # a head sized from the wrong axis of fc.weight still shows
    assert probe == default_builder_probe(GradeOptions(probe_key=key))


@pytest.mark.parametrize("key", [None, *KEYS])
def test_no_builder_probe_has_a_dim_equal_to_a_number_of_keys_one_enqueue_brings(key):
    """A module that counts its keys along the feature axis (``keys.shape[1]``) passed when
    the probe's dim was 16 and a symmetric module enqueued 2 · 8 keys a step: the dim is
    never the batch, both views' keys, a world batch or both views' keys of one."""
    probe = default_builder_probe(GradeOptions(probe_key=key))
    world = probe.ranks * probe.ranks_batch
    arrivals = {probe.batch, 2 * probe.batch, probe.ranks_batch, 2 * probe.ranks_batch,
                world, 2 * world}
    assert probe.dim not in arrivals and probe.dim not in (probe.K, probe.ragged_K)


def test_the_secret_never_reaches_the_submission_and_the_rubric_stays_with_the_judge():
    options = GradeOptions(probe_key=probe_key_of("s3cret"), rubric=(("total", 50.0),))
    sent = options.for_the_probe().to_dict()
    assert "s3cret" not in repr(sent) and sent["rubric"] == ()
    assert sent["probe_key"] == options.probe_key  # the key, a digest, draws the probe
