"""The platforms' runs are a course's own: the Gradescope zip and the PrairieLearn question
carry a course secret made when they are built, beside the rubric (which no job can read),
and the grader draws its probe from it, never the README's documented default."""

from __future__ import annotations

from moco_ref.platforms.course import CONFIG_NAME, SECRET_NAME, new_course_secret, read_config_in
from moco_ref.probe.builder import default_builder_probe
from moco_ref.probe.cases import default_lab_probe
from moco_ref.probe.options import GradeOptions, probe_key_of


def test_a_bundled_secret_becomes_the_probe_key(tmp_path):
    secret = new_course_secret()
    (tmp_path / SECRET_NAME).write_text(secret)
    (tmp_path / CONFIG_NAME).write_text('{"style": "lab"}')
    config, _ = read_config_in(tmp_path)
    assert config["probe_key"] == probe_key_of(secret.strip())
    key = config["probe_key"]
    assert default_lab_probe(0, key) != default_lab_probe(0)  # not the documented probe
    assert default_builder_probe(GradeOptions(probe_key=key)) != default_builder_probe(
        GradeOptions())


def test_without_a_secret_the_run_keeps_the_documented_probe(tmp_path):
    (tmp_path / CONFIG_NAME).write_text('{"style": "lab"}')
    assert "probe_key" not in read_config_in(tmp_path)[0]
    (tmp_path / SECRET_NAME).write_text("\n")  # an empty file is no secret
    assert "probe_key" not in read_config_in(tmp_path)[0]


def test_each_build_makes_a_new_secret():
    made = {new_course_secret() for _ in range(5)}
    assert len(made) == 5 and all(len(s.strip()) == 64 for s in made)
