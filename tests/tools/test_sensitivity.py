"""``moco-ref sensitivity``: the mutant generator (each operator on a tiny module, stable ids,
what is never mutated, non-compiling mutants discarded), the reviewed equivalents file, the
command line's usage errors, and a few hand-picked mutants graded end to end."""

from __future__ import annotations

import ast
import functools
import json
import textwrap
from pathlib import Path

import pytest

from moco_ref.cli import main
from moco_ref.probe.options import GradeOptions
from moco_ref.tools import sensitivity
from moco_ref.tools.mutants import generate

SUBMISSIONS = Path(__file__).resolve().parents[2] / "examples" / "submissions"
EQUIVALENTS = SUBMISSIONS / "sensitivity_equivalents.toml"
LAB = SUBMISSIONS / "correct_lab_order.py"

# A tiny lab-style module: train_moco (with a docstring) calls a helper; views and SEED are
# the grader's.
TINY = textwrap.dedent('''
    SEED = 3


    def views(batch):
        return batch + 1


    def helper(x):
        return x * 2


    def unused(x):
        return x - 1


    def train_moco(initial, x, train, epochs=3):
        """Train. 1 + 1"""
        torch.manual_seed(SEED + 2)
        y = helper(x) - 1
        if y < 5:
            y = 0.5
        queue = y[-capacity:]
        loss = f(a, b, key=1)
        opt.step()
        q = F.normalize(q, dim=1)
        p.mul_(m)
        z = q @ k.T
        s = x.detach().sum()
        return y
''')


@functools.cache
def _mutants_of(name: str):
    """The mutants of one bundled solution, generated once per process (about 1 s each); the
    test of stable ids generates its own second set to compare with."""
    return generate((SUBMISSIONS / name).read_text())


def _sources(text: str, **kwargs) -> dict[str, object]:
    """The mutants of ``text`` by their module's AST (as ``ast.dump`` writes it)."""
    return {ast.dump(ast.parse(m.source)): m for m in generate(text, **kwargs).mutants}


def _with(line: str, replacement: str) -> str:
    """TINY with one line replaced, written by hand (not by the code under test)."""
    assert TINY.count(line) == 1, line
    return TINY.replace(line, replacement)


@pytest.mark.parametrize(("operator", "line", "replacement"), [
    ("arith", "    y = helper(x) - 1\n", "    y = helper(x) + 1\n"),
    ("arith", "    return x * 2\n", "    return x / 2\n"),
    ("compare", "    if y < 5:\n", "    if y <= 5:\n"),
    ("constant", "    if y < 5:\n", "    if y < 6:\n"),
    ("constant", "    if y < 5:\n", "    if y < 0:\n"),
    ("constant", "        y = 0.5\n", "        y = 1.0\n"),
    ("constant", "    loss = f(a, b, key=1)\n", "    loss = f(a, b, key=2)\n"),
    ("slice", "    queue = y[-capacity:]\n", "    queue = y[:]\n"),
    ("slice", "    queue = y[-capacity:]\n", "    queue = y[capacity:]\n"),
    ("drop-arg", "    loss = f(a, b, key=1)\n", "    loss = f(b, key=1)\n"),
    ("drop-arg", "    loss = f(a, b, key=1)\n", "    loss = f(a, key=1)\n"),
    ("drop-arg", "    loss = f(a, b, key=1)\n", "    loss = f(a, b)\n"),
    ("drop-stmt", "    opt.step()\n", "    pass\n"),
    ("drop-stmt", "    y = helper(x) - 1\n", "    pass\n"),
    ("drop-stmt", "    torch.manual_seed(SEED + 2)\n", "    pass\n"),
    ("swap-args", "    loss = f(a, b, key=1)\n", "    loss = f(b, a, key=1)\n"),
    ("dim", "    q = F.normalize(q, dim=1)\n", "    q = F.normalize(q, dim=0)\n"),
    ("dim", "    z = q @ k.T\n", "    z = q @ k\n"),
    ("arith", "    z = q @ k.T\n", "    z = q * k.T\n"),
    ("method", "    p.mul_(m)\n", "    p.add_(m)\n"),
    ("method", "    s = x.detach().sum()\n", "    s = x.sum()\n"),
    ("method", "    s = x.detach().sum()\n", "    s = x.detach().mean()\n"),
    ("method", "    q = F.normalize(q, dim=1)\n", "    q = q\n"),
])
def test_each_operator_writes_the_expected_mutant(operator, line, replacement):
    expected = ast.dump(ast.parse(_with(line, replacement)))
    mutants = _sources(TINY, style="lab")
    assert expected in mutants, f"no {operator} mutant writes {replacement.strip()!r}"
    mutant = mutants[expected]
    assert mutant.operator == operator
    assert mutant.description.startswith(f"line {mutant.line}: '")
    assert mutant.id.startswith(f"{operator}:{mutant.line}:")
    assert TINY.splitlines()[mutant.line - 1] == line.rstrip("\n")


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_descriptions_name_the_change():
    descriptions = {m.id: m.description for m in _mutants_of(LAB.name).mutants}
    assert descriptions["dim:51:46:0"] == "line 51: 'dim=1' → 'dim=0'"
    slice_70 = [d for d in descriptions.values() if d.startswith("line 70:")]
    assert "line 70: '…ueue, k])[-capacity:]' → '…ueue, k])[capacity:]'" in slice_70
    assert all(len(d) <= 78 for d in descriptions.values())  # shown indented by 2


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_ids_are_stable_and_unique():
    first = [(m.id, m.source) for m in _mutants_of(LAB.name).mutants]
    second = [(m.id, m.source) for m in generate(LAB.read_text()).mutants]
    assert first == second
    ids = [mutant_id for mutant_id, _ in first]
    assert len(set(ids)) == len(ids)
    assert len({source for _, source in first}) == len(first)  # no duplicates


def test_docstrings_views_seed_and_unused_functions_are_not_mutated():
    original = ast.parse(TINY)

    def kept(tree):
        train = next(n for n in tree.body if getattr(n, "name", "") == "train_moco")
        untouched = [n for n in tree.body if getattr(n, "name", "") in ("views", "unused")]
        seed = next(n for n in tree.body if isinstance(n, ast.Assign))
        return (ast.get_docstring(train), [ast.dump(n) for n in untouched], ast.dump(seed),
                ast.dump(train.args))

    result = generate(TINY, style="lab")
    assert result.functions == ("helper", "train_moco")
    assert result.mutants
    for mutant in result.mutants:
        assert kept(ast.parse(mutant.source)) == kept(original), mutant.description
        assert mutant.line not in (2, 5, 6, 13, 14, 18)  # SEED, views, unused, the docstring
        if mutant.line == 19:  # torch.manual_seed(SEED + 2): the grader's seed, only dropped
            assert mutant.operator == "drop-stmt"


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_builder_mutates_the_class_methods_and_their_helpers():
    result = _mutants_of("builder_correct_official_style.py")
    assert result.style == "builder"
    assert result.functions[0] == "gather_from_all_ranks"
    assert "MoCo.forward" in result.functions and "MoCo.__init__" in result.functions
    assert not any(m.line <= 5 for m in result.mutants)  # the module's docstring


def test_mutants_that_do_not_compile_are_discarded():
    source = textwrap.dedent('''
        def train_moco(x):
            total = 1

            def add():
                nonlocal total
                total += x

            add()
            return total
    ''')
    result = generate(source, style="lab")
    dropped = ast.dump(ast.parse(source.replace("    total = 1\n", "    pass\n", 1)))
    assert [ast.dump(ast.parse(m.source)) for m in result.not_compiling] == [dropped]
    assert dropped not in {ast.dump(ast.parse(m.source)) for m in result.mutants}
    assert result.generated == len(result.mutants) + 1
    for mutant in result.mutants:
        compile(mutant.source, "<mutant>", "exec")


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_the_equivalents_file_names_mutants_of_its_files():
    entries = sensitivity.load_equivalents(EQUIVALENTS)
    assert entries
    ids_of: dict[str, set[str]] = {}
    for entry in entries:
        if entry.file not in ids_of:
            ids_of[entry.file] = {m.id for m in _mutants_of(entry.file).mutants}
        assert entry.id in ids_of[entry.file], f"{entry.file}: no mutant {entry.id}"
        assert len(entry.reason) > 20
    assert len({(e.file, e.id) for e in entries}) == len(entries)


def test_a_bad_equivalents_file_is_one_line(tmp_path):
    bad = tmp_path / "eq.toml"
    bad.write_text('[[equivalent]]\nid = "x"\n', encoding="utf-8")
    with pytest.raises(sensitivity.SensitivityError, match="entry 1 needs id, file and reason"):
        sensitivity.load_equivalents(bad)


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
@pytest.mark.parametrize("argv", [
    ["sensitivity", "no/such/solution.py"],
    ["sensitivity", str(LAB), "--limit", "many"],
    ["sensitivity", str(LAB), "-j", "0"],
    ["sensitivity", str(LAB), "--min-kill-rate", "1.5"],
    ["sensitivity", str(LAB), "--equivalents", "no/such/file.toml"],
])
def test_usage_errors_exit_2_with_one_line(argv, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moco-ref: error: ")


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_list_prints_every_mutant(capsys):
    assert main(["sensitivity", str(LAB), "--list"]) == 0
    out = capsys.readouterr().out
    assert "slice:70:46:1\n    line 70: " in out


def test_kill_rate_and_report_from_stubbed_grading(tmp_path):
    """The bookkeeping, without the sandbox: a stand-in grader fails every mutant whose
    source lacks ``-capacity`` (so the slice mutants are killed)."""
    from moco_ref.judge.results import CheckResult, Status, SubmissionReport

    def fake_grade_many(paths, options, jobs=1, on_report=None):
        reports = []
        for path in paths:
            text = Path(path).read_text()
            status = Status.PASSED if text.count("[-capacity:]") == 2 else Status.FAILED
            report = SubmissionReport(path, "lab", True, [CheckResult(
                "I3-fifo-keeps-newest", "fifo", "I3", 2, status)])
            if on_report:
                on_report(report)
            reports.append(report)
        return reports

    mutant_set = _mutants_of(LAB.name)
    equivalents = [sensitivity.Equivalent("drop-arg:55:20:1", LAB.name, "default dim"),
                   sensitivity.Equivalent("slice:70:46:1", LAB.name, "wrongly listed"),
                   sensitivity.Equivalent("nope:1:1:0", LAB.name, "stale")]
    measurement = sensitivity.measure(
        LAB, mutant_set, GradeOptions(), equivalents=equivalents,
        only=["slice:70:46:1", "slice:71:56:1", "drop-arg:55:20:1", "dim:51:46:0"],
        grade_many=fake_grade_many)
    assert [o.mutant.id for o in measurement.killed] == ["slice:71:56:1"]
    assert [o.mutant.id for o in measurement.survivors] == ["dim:51:46:0"]
    assert measurement.kill_rate == 0.5
    assert [o.mutant.id for o in measurement.killed_equivalents] == ["slice:70:46:1"]
    assert [e.id for e in measurement.stale_equivalents] == ["nope:1:1:0"]
    lines = sensitivity.report_lines(measurement, 0.98)
    assert lines[0] == f"moco-ref sensitivity: {LAB}"
    assert all(len(line) <= 80 for line in lines[1:]), [x for x in lines if len(x) > 80]
    text = "\n".join(lines)
    assert "killed: 1 of 2 = 50.0%" in text and "ERROR: 1 reviewed equivalent" in text
    data = json.loads(json.dumps(measurement.to_dict()))
    assert data["survivors"][0]["id"] == "dim:51:46:0"
    assert data["killed_equivalents"][0]["killed_by"] == ["I3-fifo-keeps-newest"]


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_hand_picked_mutants_graded_end_to_end(tmp_path, capsys):
    """Through the real grader (the sandbox), ``-j 2``: dropping the minus of ``-capacity:``
    keeps the oldest keys and is killed, and so is the EMA with its arguments swapped;
    F.normalize without its dim=1 (the default) is a reviewed equivalent and keeps full
    marks."""
    from moco_ref.cli.isolation import isolation_refusal

    refusal = isolation_refusal()
    if refusal:
        pytest.skip(refusal)
    out = tmp_path / "report.json"
    picked = ["slice:70:46:1", "swap-args:53:32:0", "drop-arg:55:20:1"]
    argv = ["sensitivity", str(LAB), "--style", "lab", "-j", "2", "--json", str(out),
            "--equivalents", str(EQUIVALENTS), "--min-kill-rate", "1.0"]
    for mutant_id in picked:
        argv += ["--mutant", mutant_id]
    code = main(argv)
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    verdicts = {o["id"]: (o["verdict"], o["equivalent"] is not None) for o in data["outcomes"]}
    assert verdicts == {"slice:70:46:1": ("killed", False),
                        "swap-args:53:32:0": ("killed", False),
                        "drop-arg:55:20:1": ("survived", True)}, printed
    assert data["kill_rate"] == 1.0 and data["killed_equivalents"] == []
    assert "killed: 2 of 2 = 100.0%" in printed
    assert code == 0
