"""The rubric: a fixed maximum per style, each invariant family a comparable share, and a
course's own weights from a TOML file."""

from __future__ import annotations

import pytest

from moco_ref.cli import main
from moco_ref.judge.judge import judge
from moco_ref.judge.registry import all_checks
from moco_ref.judge.results import Status
from moco_ref.judge.rubric import (
    DEFAULT_RUBRIC,
    Rubric,
    RubricError,
    load_rubric,
    rubric_from_mapping,
)
from moco_ref.observe.observers import observe
from moco_ref.probe.options import STYLES, GradeOptions
from tests.helpers.conformance_support import SUBMISSIONS, grade, load_namespace, round_trip


@pytest.fixture(scope="module")
def correct_record():
    return round_trip(observe(load_namespace(SUBMISSIONS / "correct_lab_order.py"), "lab",
                              GradeOptions()))


@pytest.mark.parametrize("style", STYLES)
def test_every_style_is_out_of_100_with_equal_family_shares(style):
    points = DEFAULT_RUBRIC.points(style)
    families = {spec.family for spec in all_checks(style)}
    assert set(points) == {spec.check_id for spec in all_checks(style)}
    assert sum(points.values()) == pytest.approx(100)
    # every family weighs 1 and warmup 0.5: written out, not computed by the rubric
    unit = 100 / (len(families) - (0.5 if "warmup" in families else 0))
    for family in families:
        share = sum(p for c, p in points.items() if c.split("-", 1)[0] == family)
        # each check is rounded to cents (largest remainder): a share is off by < 1 cent each
        members = sum(1 for c in points if c.split("-", 1)[0] == family)
        assert share == pytest.approx(unit * (0.5 if family == "warmup" else 1),
                                      abs=0.01 * members)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("total", [100, 50, 7, 33.33])
def test_points_are_cents_that_add_up_to_the_total_exactly(style, total):
    points = Rubric(total=total).points(style)
    cents = [round(p * 100) for p in points.values()]
    assert all(abs(p * 100 - c) < 1e-6 for p, c in zip(points.values(), cents))
    assert sum(cents) == round(total * 100)


def test_a_check_that_does_not_apply_gives_its_share_to_its_family():
    """A single-process builder module: the across-ranks checks do not apply, and their
    shares go to the other checks of their families; the maximum stays the total."""
    full = DEFAULT_RUBRIC.points("builder")
    skipped = {"I3-keys-of-all-ranks", "I8-positive-across-ranks"}
    points = DEFAULT_RUBRIC.points("builder", skipped)
    assert skipped.isdisjoint(points) and round(sum(points.values()), 2) == 100
    for family in ("I3", "I8", "I1", "I4", "contract"):
        before = sum(p for c, p in full.items() if c.startswith(family + "-"))
        after = sum(p for c, p in points.items() if c.startswith(family + "-"))
        assert after == pytest.approx(before, abs=0.02)
    kept = [c for c in points if c.startswith("I3-")]
    assert all(points[c] > full[c] for c in kept)  # the share moved to them


def test_a_family_none_of_whose_checks_applies_gives_its_share_to_the_others():
    everything_i9 = {spec.check_id for spec in all_checks("lab") if spec.family == "I9"}
    points = DEFAULT_RUBRIC.points("lab", everything_i9)
    assert round(sum(points.values()), 2) == 100 and everything_i9.isdisjoint(points)


def test_a_family_share_is_split_by_the_declared_points():
    points = DEFAULT_RUBRIC.points("lab")
    # I3 declares 2, 1, 2 points: its share splits 2/5, 1/5, 2/5
    i3 = points["I3-fifo-keeps-newest"] + points["I3-oldest-first-order"] + \
        points["I3-ids-move-with-keys"]
    assert points["I3-oldest-first-order"] == pytest.approx(i3 / 5, abs=0.01)
    assert points["I3-fifo-keeps-newest"] == pytest.approx(2 * i3 / 5, abs=0.01)


def test_a_course_rubric_reweights_families_and_checks(tmp_path):
    path = tmp_path / "rubric.toml"
    path.write_text('total = 50\n[families]\nI4 = 3\nwarmup = 0\n'
                    '[checks]\n"I4-positive-never-masked" = 2\n')
    rubric = load_rubric(path)
    points = rubric.points("lab")
    assert sum(points.values()) == pytest.approx(50)
    assert points["warmup-returns-structure"] == 0
    # 9 families of weight 1 besides I4 (3) and warmup (0): I4 is 3/12 of 50
    i4 = points["I4-same-source-masked"] + points["I4-positive-never-masked"]
    assert i4 == pytest.approx(50 * 3 / 12)
    assert points["I4-positive-never-masked"] == pytest.approx(points["I4-same-source-masked"])
    assert Rubric.from_pairs(rubric.to_pairs()) == rubric


@pytest.mark.parametrize(("text", "says"), [
    ("totl = 3\n", "unknown key 'totl'"),
    ("[families]\nI10 = 1\n", "no family 'I10'"),
    ("[checks]\n\"I4-nope\" = 1\n", "no check 'I4-nope'"),
    ("[checks]\nI4 = 1\n", "no check 'I4'"),
    ("[families]\nI4 = -1\n", "must be a number ≥ 0"),
    ("total = 0\n", "total must be positive"),
    ("total = \n", "not valid TOML"),
])
def test_a_bad_rubric_is_one_line(tmp_path, text, says):
    path = tmp_path / "rubric.toml"
    path.write_text(text)
    with pytest.raises(RubricError) as caught:
        load_rubric(path)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_grade_refuses_a_bad_rubric_with_exit_2(tmp_path, capsys):
    path = tmp_path / "rubric.toml"
    path.write_text("[families]\nI99 = 1\n")
    code = main(["grade", str(SUBMISSIONS / "correct_lab_order.py"), "--rubric", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "I99" in err


def test_rubric_show_prints_the_effective_points(tmp_path, capsys):
    assert main(["rubric", "show", "--style", "builder"]) == 0
    text = capsys.readouterr().out
    assert "builder: 100 points" in text and "I7-ema-law" in text
    assert "I4-same-source-masked" not in text


def test_the_maximum_is_fixed_whatever_the_submission_does(correct_record):
    """A not-judged check keeps its place in the maximum: a crash does not shrink it."""
    correct, _ = judge(correct_record, "lab", GradeOptions())
    crashed = dict(correct_record)
    crashed["train_moco"] = {**correct_record["train_moco"], "error": "RuntimeError: boom"}
    broken, _ = judge(crashed, "lab", GradeOptions())
    maximum = [sum(r.max_points for r in rs if r.status is not Status.NOT_APPLICABLE)
               for rs in (correct, broken)]
    assert maximum[0] == pytest.approx(maximum[1]) == pytest.approx(100)
    assert any(r.status is Status.NOT_JUDGED for r in broken)


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_a_module_without_ema_loses_the_whole_ema_share():
    results, _ = grade(load_namespace(SUBMISSIONS / "builder_bug_no_ema.py"), "builder")
    score = sum(r.points for r in results)
    share = sum(p for c, p in DEFAULT_RUBRIC.points("builder").items() if c.startswith("I7-"))
    assert score <= 100 - share + 1e-9
    assert share == pytest.approx(100 / 8)


def test_rubric_pairs_in_the_options_set_the_points(correct_record):
    rubric = rubric_from_mapping({"families": {"I1": 0}})
    results, _ = judge(correct_record, "lab", GradeOptions(rubric=rubric.to_pairs()))
    by_id = {r.check_id: r for r in results}
    assert by_id["I1-key-grads-none"].max_points == 0
    assert sum(r.points for r in results) == pytest.approx(100)


def test_visibility_and_output_settings(tmp_path):
    path = tmp_path / "rubric.toml"
    path.write_text('[visibility]\nI4 = "after_due_date"\n"I4-positive-never-masked" = "hidden"\n'
                    '[output]\nshow_submission_output = true\n')
    rubric = load_rubric(path)
    assert rubric.visibility_of("I4-same-source-masked") == "after_due_date"
    assert rubric.visibility_of("I4-positive-never-masked") == "hidden"
    assert rubric.visibility_of("I3-fifo-keeps-newest") == "visible"
    assert rubric.show_submission_output is True
    assert DEFAULT_RUBRIC.show_submission_output is False
    for text, says in (('[visibility]\nI4 = "later"\n', "must be one of"),
                       ('[visibility]\nI44 = "hidden"\n', "no check or family 'I44'"),
                       ('[output]\nshow = 1\n', "no setting 'show'")):
        path.write_text(text)
        with pytest.raises(RubricError, match=says):
            load_rubric(path)
