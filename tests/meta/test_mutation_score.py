"""mutation/score.py and the reviewed list of equivalent mutants (issue 9)."""

import importlib.util
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _score_module():
    spec = importlib.util.spec_from_file_location("mutation_score", ROOT / "mutation" / "score.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


score = _score_module()
CHANGES = {"m.f__mutmut_1": ["x = 2"], "m.f__mutmut_2": ["y = None"], "m.f__mutmut_3": ["z = 0"]}
EQUIVALENT = {"m.f__mutmut_2": {"mutant": "m.f__mutmut_2", "changed": "y = None", "reason": "r"}}


def _report(statuses, equivalents=EQUIVALENT, target=50.0):
    return score.report(statuses, equivalents, CHANGES.__getitem__, target)


def test_equivalents_leave_the_denominator_and_survivors_are_listed():
    lines, passed = _report({"m.f__mutmut_1": "killed", "m.f__mutmut_2": "survived",
                             "m.f__mutmut_3": "survived"})
    assert lines == ["survived: m.f__mutmut_3  + z = 0",
                     "mutation score: 50.0% (killed 1 of 2 non-equivalent)"]
    assert passed


def test_timeouts_count_as_killed_and_the_target_is_enforced():
    statuses = {"m.f__mutmut_1": "timeout", "m.f__mutmut_2": "survived",
                "m.f__mutmut_3": "no tests"}
    lines, passed = _report(statuses, target=95.0)
    assert lines[-1] == "mutation score: 50.0% (killed 1 of 2 non-equivalent)" and not passed


@pytest.mark.parametrize(
    ("statuses", "problem"),
    [
        ({"m.f__mutmut_1": "killed", "m.f__mutmut_2": "killed"}, "is now killed"),
        ({"m.f__mutmut_1": "killed"}, "no longer exists"),
        ({"m.f__mutmut_1": "not checked", "m.f__mutmut_2": "survived"}, "incomplete run"),
    ],
    ids=["killed-equivalent", "vanished-equivalent", "unchecked"],
)
def test_stale_entries_and_incomplete_runs_fail(statuses, problem):
    lines, passed = _report(statuses, target=0.0)
    assert not passed and any(problem in line for line in lines[:-1]), lines


def test_a_renumbered_equivalent_is_stale():
    moved = {"m.f__mutmut_2": {"mutant": "m.f__mutmut_2", "changed": "x = 2", "reason": "r"}}
    lines, passed = _report({"m.f__mutmut_1": "killed", "m.f__mutmut_2": "survived"}, moved, 0.0)
    assert not passed and "no longer writes 'x = 2'" in lines[0]


def test_every_listed_equivalent_is_well_formed():
    """Each entry names a mutant of a mutated module, the line it writes and a one-line
    reason; no mutant is listed twice."""
    path = ROOT / "mutation" / "equivalents.toml"
    entries = score.load_equivalents(path)
    only_mutate = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"][
        "only_mutate"]
    modules = {p.removesuffix(".py").replace("/", ".") for p in only_mutate}
    assert entries
    for name, entry in entries.items():
        assert name.rsplit(".", 1)[0] in modules, name
        assert "__mutmut_" in name and entry["changed"].strip(), name
        assert entry["reason"].strip() and "\n" not in entry["reason"], name
