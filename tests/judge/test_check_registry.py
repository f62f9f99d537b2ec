"""The check registry: one declaration per check, implementations named after the id,
selection by whole id or family, and ``moco-ref checks``."""

from __future__ import annotations

import json

import pytest

from moco_ref.cli import main
from moco_ref.judge import registry
from moco_ref.judge.registry import FAMILIES, all_checks
from moco_ref.judge.rubric import DEFAULT_RUBRIC
from moco_ref.probe.options import STYLES, GradeOptions


@pytest.fixture
def scratch_registry(monkeypatch):
    monkeypatch.setattr(registry, "_CHECKS", {})


def test_a_check_is_declared_once(scratch_registry):
    registry.check("I3-made-up", "a title", points=1, contract="a contract")
    with pytest.raises(ValueError, match="declared twice"):
        registry.check("I3-made-up", "another title", points=2, contract="another")


@pytest.mark.parametrize("bad_id", ["I10-not-a-family", "I3", "fifo-keeps-newest"])
def test_a_check_id_starts_with_its_family(scratch_registry, bad_id):
    with pytest.raises(ValueError, match="must start with one of"):
        registry.check(bad_id, "t", points=1, contract="c")


def test_implementations_are_named_after_the_id(scratch_registry):
    spec = registry.check("I3-made-up", "t", points=1, contract="c")

    def i3_made_up_lab(ev):
        """lab: how it is judged."""

    def i3_made_up(ev):
        """shared by two styles."""

    spec.judges("lab")(i3_made_up_lab)
    spec.judges("builder", "components")(i3_made_up)
    assert spec.styles == ("lab", "builder", "components")
    assert spec.how_judged("lab") == "lab: how it is judged."

    def check_fifo(ev):
        pass

    other = registry.check("I3-other", "t", points=1, contract="c")
    with pytest.raises(ValueError, match="must be named i3_other_lab, not check_fifo"):
        other.judges("lab")(check_fifo)
    with pytest.raises(ValueError, match="already has a 'lab' implementation"):
        spec.judges("lab")(i3_made_up_lab)
    with pytest.raises(ValueError, match="unknown style 'notebook'"):
        other.judges("notebook")(check_fifo)


def test_every_real_implementation_follows_the_naming_rule():
    for spec in all_checks():
        for style, function in spec.implementations.items():
            assert function.__name__ == spec.function_name(style), (spec.check_id, style)
            assert function.__module__.startswith("moco_ref.judge.checks."), function.__module__
            assert len(spec.how_judged(style)) > 30, (spec.check_id, style)


def test_each_family_lives_in_its_own_module():
    homes = {}
    for spec in all_checks():
        for function in spec.implementations.values():
            homes.setdefault(spec.family, set()).add(function.__module__)
    assert set(homes) == set(FAMILIES)
    assert all(len(modules) == 1 for modules in homes.values()), homes
    assert len({next(iter(m)) for m in homes.values()}) == len(FAMILIES)


@pytest.mark.parametrize(
    "selectors, check_id, selected",
    [
        ((), "I3-fifo-keeps-newest", True),
        (("I1",), "I1-key-grads-none", True),
        (("I1",), "I10-future-check", False),
        (("I3-fifo-keeps-newest",), "I3-fifo-keeps-newest", True),
        (("I3-fifo",), "I3-fifo-keeps-newest", False),
        (("fifo",), "I3-fifo-keeps-newest", False),
        (("contract", "I9"), "I9-batch-not-own-negative", True),
    ],
)
def test_selection_is_by_whole_id_or_family(selectors, check_id, selected):
    assert GradeOptions(checks=selectors).selects(check_id) is selected


def test_unknown_selectors_are_named():
    assert registry.unknown_selectors(["I3", "I3-fifo-keeps-newest", "I3-fifo", "I10"]) == [
        "I3-fifo", "I10"]


def test_checks_command_lists_every_check_per_style(capsys):
    assert main(["checks", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["checks"]
    specs = all_checks()
    assert [entry["id"] for entry in listed] == [spec.check_id for spec in specs]
    for entry, spec in zip(listed, specs):
        assert entry["weight"] == spec.points and entry["contract"] == spec.contract
        for style, info in entry["styles"].items():  # the default rubric's points
            assert info["points"] == pytest.approx(DEFAULT_RUBRIC.points(style)[spec.check_id])
        assert set(entry["styles"]) == set(spec.styles)
        assert set(entry["styles"]) | set(entry["not_applicable"]) == set(STYLES)
    assert main(["checks", "--style", "builder"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("builder: 19 checks, 100 points (default rubric)")
    assert "I4-same-source-masked" not in text  # never applies to builder
