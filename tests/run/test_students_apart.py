"""Students never share code paths (issue 26): helper modules come only from a student's own
folder; a graded file is nobody's helper; a helper that would shadow an installed module is
refused with a note; a link is never followed (refused and flagged on its own student); one
bad member of an export skips and flags only its own student."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from moco_ref.probe.options import GradeOptions
from moco_ref.run import pipeline as _pipeline  # noqa: F401 - loaded before the stand-in
from moco_ref.run.archive import unpack_zip
from moco_ref.run.batch import grade_folder, refused_report
from moco_ref.run.cache import cache_key
from moco_ref.run.intake import find_targets
from moco_ref.sandbox.attempt import (
    copy_submission,
    helper_files,
    installed_top_level_names,
    refused_helpers,
    shadowed_module,
)
from tests.helpers.grading_stubs.fixtures import GOOD_WARMUP, stubbed, write  # noqa: F401

ENTRY = "\ndef train_moco(*args):\n    return None\n"
SOLVER = GOOD_WARMUP  # binds only the warm-up: a helper module, were it one's own
CHEAT = "from solver import moco_warmup  # noqa: F401\n" + ENTRY  # imports a sibling


def _copied(target, tmp_path: Path, helpers: bool) -> list[str]:
    """The files a submission's process would get (``copy_submission``)."""
    folder = tmp_path / "copy"
    copy_submission(target, folder, helpers=helpers)
    return sorted(path.name for path in folder.iterdir())


def _by_name(targets) -> dict:
    return {target.name: target for target in targets}


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize("classmate", [
    ("numpy.py", "from _impl import train_moco as _impl\ntrain_moco = _impl\n"),  # assignment
    ("solver.py", SOLVER),  # binds no entry point of its own
    ("helpers.py", "from solution import MoCo as MoCo\n"),  # import-as
])
def test_in_a_flat_class_folder_no_classmate_is_a_helper(tmp_path, classmate):
    name, source = classmate
    folder = tmp_path / "class"
    folder.mkdir()
    write(folder, "alice.py", "from numpy import train_moco as theirs  # noqa: F401\n" + ENTRY)
    write(folder, name, source)
    targets = _by_name(find_targets([folder], tmp_path / "work"))
    assert set(targets) == {"alice.py", name}
    assert not any(target.helpers for target in targets.values())
    alice = targets["alice.py"]
    assert _copied(alice.path, tmp_path, alice.helpers) == ["alice.py"]


def test_a_classmate_is_not_a_helper_in_a_subfolder_of_a_class_folder_either(tmp_path):
    folder = tmp_path / "class" / "group-a"
    folder.mkdir(parents=True)
    write(folder, "alice.py", CHEAT)
    write(folder, "solver.py", SOLVER)
    alice = _by_name(find_targets([tmp_path / "class"], tmp_path / "work"))["group-a/alice.py"]
    assert alice.helpers is False
    assert _copied(alice.path, tmp_path, alice.helpers) == ["alice.py"]


def test_files_given_one_by_one_from_one_folder_are_classmates(tmp_path):
    folder = tmp_path / "given"
    folder.mkdir()
    alice, bob = write(folder, "alice.py", CHEAT), write(folder, "bob.py", ENTRY)
    write(folder, "solver.py", SOLVER)
    assert [t.helpers for t in find_targets([alice, bob], tmp_path / "work")] == [False, False]
    single = find_targets([alice], tmp_path / "work")[0]
    assert single.helpers is True  # a single file keeps the helpers of its own folder
    assert _copied(single.path, tmp_path, single.helpers) == ["alice.py", "solver.py"]


def test_per_student_folders_keep_their_own_helpers_and_nothing_that_is_graded(tmp_path):
    alice = tmp_path / "class" / "alice"
    alice.mkdir(parents=True)
    write(alice, "main.py", CHEAT)
    write(alice, "solver.py", SOLVER)
    write(alice, "second.py", "train_moco = print\n")  # binds an entry point: not a helper
    bob = tmp_path / "class" / "bob"
    bob.mkdir()
    write(bob, "main.py", ENTRY)
    targets = _by_name(find_targets([tmp_path / "class"], tmp_path / "work", per_folder=True))
    target = targets["alice/main.py"]
    assert target.helpers is True and targets["bob/main.py"].helpers is True
    assert [p.name for p in helper_files(target.path)] == ["solver.py"]
    assert _copied(target.path, tmp_path, target.helpers) == ["main.py", "solver.py"]
    assert "not graded on their own: solver.py" in target.note
    assert "neither graded nor its helpers: second.py" in target.note


def test_the_cache_key_of_a_flat_folder_ignores_its_siblings(tmp_path):
    folder = tmp_path / "class"
    folder.mkdir()
    write(folder, "alice.py", CHEAT)
    target = find_targets([folder], tmp_path / "work")[0]
    key = cache_key(target, GradeOptions())
    write(folder, "solver.py", SOLVER)  # a classmate arriving changes nothing of alice's
    assert cache_key(target, GradeOptions()) == key
    own = replace(target, helpers=True)
    assert cache_key(own, GradeOptions()) != cache_key(replace(own, helpers=False),
                                                       GradeOptions())


# --------------------------------------------------------------------------- shadowing


@pytest.mark.parametrize("name, shadows", [
    ("random.py", "the standard library's random"),
    ("copy.py", "the standard library's copy"),
    ("torch.py", "the installed module torch"),
    ("numpy.py", "the installed module numpy"),
    ("hypothesis.py", "the installed module hypothesis"),
])
def test_a_helper_named_like_an_installed_module_is_refused_with_a_note(tmp_path, name,
                                                                        shadows):
    folder = tmp_path / "alice"
    folder.mkdir()
    main = write(folder, "main.py", CHEAT)
    write(folder, "solver.py", SOLVER)
    write(folder, name, "def anything():\n    return 1\n")
    assert [p.name for p in helper_files(main)] == ["solver.py"]
    assert _copied(main, tmp_path, True) == ["main.py", "solver.py"]
    (note,) = refused_helpers(main)
    assert note.startswith(f"{name} beside the submission was not given to it") and \
        shadows in note


def test_the_submission_s_own_file_is_never_refused_for_its_name(tmp_path):
    folder = tmp_path / "alice"
    folder.mkdir()
    main = write(folder, "numpy.py", ENTRY)
    write(folder, "utils.py", "X = 1\n")
    assert refused_helpers(main) == []
    assert _copied(main, tmp_path, True) == ["numpy.py", "utils.py"]


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_installed_names_are_read_without_importing_anything():
    code = ("import sys; from moco_ref.sandbox.attempt import installed_top_level_names as f;"
            "before = set(sys.modules); stdlib, installed = f();"
            "new = {m.split('.')[0] for m in set(sys.modules) - before} & installed;"
            "print(sorted(new)); print('sklearn' in installed, 'random' in stdlib)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parent).stdout.split("\n")
    assert out[:2] == ["[]", "True True"]
    _, installed = installed_top_level_names()
    assert "tests" not in installed and shadowed_module("utils") == ""  # not the work folder


# --------------------------------------------------------------------------- links


def test_a_link_in_a_flat_class_folder_is_refused_and_flagged(tmp_path):
    folder, outside = tmp_path / "class", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    write(folder, "alice.py", ENTRY)
    write(outside, "solution.py", ENTRY)
    os.symlink("alice.py", folder / "bob.py")  # a classmate, inside the class folder
    os.symlink(outside / "solution.py", folder / "carol.py")  # outside it
    os.symlink(outside, folder / "group")  # a folder
    targets = _by_name(find_targets([folder], tmp_path / "work"))
    assert targets["alice.py"].refused == ""
    assert "bob.py is a link (to 'alice.py')" in targets["bob.py"].refused
    assert f"carol.py is a link (to '{outside / 'solution.py'}')" in targets["carol.py"].refused
    assert "group is a link" in targets["group"].refused
    assert "group/solution.py" not in targets  # not followed
    report = refused_report(targets["bob.py"])
    assert not report.gradable and "not followed" in report.traceback


def test_links_in_per_student_folders_are_refused_and_flagged_on_their_student(tmp_path):
    root = tmp_path / "class"
    for student in ("alice", "bob", "carol", "erin"):
        (root / student).mkdir(parents=True)
    write(root / "alice", "main.py", CHEAT)
    write(root / "alice", "solver.py", SOLVER)
    os.symlink("../alice/main.py", root / "bob" / "main.py")  # bob's main file is alice's
    write(root / "bob", "notes.py", "X = 1\n")
    write(root / "carol", "main.py", CHEAT)
    os.symlink("../alice/solver.py", root / "carol" / "solver.py")  # a helper out
    os.symlink("alice", root / "dave")  # a student's folder that is a link
    (root / "erin" / "src").mkdir()
    write(root / "erin" / "src", "main.py", ENTRY)
    os.symlink("src/main.py", root / "erin" / "main.py")  # stays inside: refused all the same
    targets = _by_name(find_targets([root], tmp_path / "work", per_folder=True))
    assert set(targets) == {"alice/main.py", "bob", "carol/main.py", "dave", "erin/src/main.py"}
    assert targets["alice/main.py"].refused == ""
    assert targets["bob"].refused.startswith("bob: not gradable: main.py is a link (to "
                                             "'../alice/main.py'), not followed")
    assert "dave is a link (to 'alice')" in targets["dave"].refused
    carol = targets["carol/main.py"]
    assert carol.refused == "" and "solver.py is a link (to '../alice/solver.py')" in carol.note
    assert _copied(carol.path, tmp_path, carol.helpers) == ["main.py"]  # not copied
    assert "main.py is a link (to 'src/main.py')" in targets["erin/src/main.py"].note


def test_a_link_out_of_a_student_s_folder_in_a_gradescope_export_on_disk(tmp_path):
    export = tmp_path / "export"
    (export / "submission_1").mkdir(parents=True)
    (export / "submission_2").mkdir()
    (export / "submission_metadata.yml").write_text(
        "submission_2:\n  :submitters:\n  - :name: Bob\n    :sid: '7'\n")
    write(export / "submission_1", "moco.py", ENTRY)
    os.symlink("../submission_1/moco.py", export / "submission_2" / "moco.py")
    targets = _by_name(find_targets([export], tmp_path / "work"))
    assert targets["submission_1/moco.py"].refused == ""
    bob = targets["submission_2"]
    assert (bob.student_id, bob.student_name) == ("7", "Bob")
    assert "moco.py is a link (to '../submission_1/moco.py')" in bob.refused


def test_a_canvas_upload_that_is_a_link_is_refused_on_its_student(tmp_path):
    folder = tmp_path / "canvas"
    folder.mkdir()
    write(folder, "ada_9001_500_moco.py", ENTRY)
    os.symlink("ada_9001_500_moco.py", folder / "bob_9002_600_moco.py")
    write(folder, "carl_9003_700_moco.py", ENTRY)
    os.symlink("carl_9003_700_moco.py", folder / "carl_9003_800_moco.py")
    targets = _by_name(find_targets([folder], tmp_path / "work"))
    assert set(targets) == {"9001/moco.py", "9002", "9003/moco.py"}
    assert "bob_9002_600_moco.py is a link" in targets["9002"].refused
    assert "carl_9003_800_moco.py is a link" in targets["9003/moco.py"].note


# --------------------------------------------------------------------------- exports


def _export(tmp_path: Path, bad) -> Path:
    """A Gradescope-like zip: alice and carol fine, bob's share holding ``bad``."""
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("export/alice/main.py", ENTRY)
        zipped.writestr("export/carol/main.py", ENTRY)
        zipped.writestr("export/carol/utils.py", "X = 1\n")
        bad(zipped)
    return archive


def _link(name: str, to: str):
    def add(zipped):
        info = zipfile.ZipInfo(name)
        info.external_attr = 0o120777 << 16
        zipped.writestr(info, to)
    return add


def _members(*pairs):
    def add(zipped):
        for name, source in pairs:
            zipped.writestr(name, source)
    return add


BAD_MEMBERS = {
    "too long": (_members(("export/bob/" + "x" * 300 + ".py", ENTRY)), "File name too long"),
    "stored link": (_link("export/bob/main.py", "../alice/main.py"),
                    "a link stored in the archive (to '../alice/main.py')"),
    "duplicate": (_members(("export/bob/main.py", ENTRY), ("export/bob/main.py", "x = 1\n")),
                  "holds 2 members of that name"),
    "file then folder": (_members(("export/bob/main.py", ENTRY), ("export/bob/main.py/x.py",
                                                                  ENTRY)), "need a folder"),
    "folder then file": (_members(("export/bob/main.py/x.py", ENTRY), ("export/bob/main.py",
                                                                       ENTRY)), "need a folder"),
    "dot-dot": (_members(("export/bob/../../../evil.py", ENTRY)), "leads out"),
    "absolute": (_members(("/export/bob/main.py", ENTRY)), "absolute"),
}


@pytest.mark.filterwarnings("ignore:Duplicate name")
@pytest.mark.parametrize("shape", sorted(BAD_MEMBERS))
def test_one_bad_member_of_an_export_flags_only_its_own_student(tmp_path, shape):
    bad, evidence = BAD_MEMBERS[shape]
    targets = _by_name(find_targets([_export(tmp_path, bad)], tmp_path / "work"))
    assert targets["alice/main.py"].refused == targets["carol/main.py"].refused == ""
    assert "utils.py" in targets["carol/main.py"].note
    flagged = [t for name, t in targets.items() if name.startswith("bob")]
    assert len(flagged) == 1, targets
    assert evidence in flagged[0].refused + flagged[0].note
    assert not list(tmp_path.rglob("evil.py"))


def test_a_bad_member_that_names_no_student_is_a_row_of_its_own(tmp_path):
    archive = tmp_path / "flat.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("alice.py", ENTRY)
        zipped.writestr("../bob.py", ENTRY)
        _link("carol.py", "/etc/passwd")(zipped)
    targets = _by_name(find_targets([archive], tmp_path / "work"))
    assert targets["alice.py"].refused == ""
    assert "'../bob.py' was not unpacked" in targets["_/bob.py"].refused
    assert "to '/etc/passwd'" in targets["carol.py"].refused
    assert not (tmp_path / "work" / "unpacked" / "flat" / "carol.py").exists()


def test_unpacking_reports_each_skipped_member_and_writes_nothing_outside(tmp_path):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("ok/main.py", ENTRY)
        zipped.writestr("../evil.py", "x = 1\n")
        zipped.writestr("/abs.py", "x = 1\n")
    folder, skipped = unpack_zip(archive, tmp_path / "work")
    assert (folder / "ok" / "main.py").read_text() == ENTRY
    assert [s.parts for s in skipped] == [("..", "evil.py"), ("abs.py",)]
    assert not (tmp_path / "evil.py").exists() and not Path("/abs.py").exists()


@pytest.mark.usefixtures("stubbed")
def test_a_flat_class_is_graded_with_students_apart(tmp_path):
    """End to end (the stand-in harness): the student who imports a classmate's module cannot
    load it; the student whose file is a link to a classmate's has a not-gradable row."""
    folder = tmp_path / "class"
    folder.mkdir()
    write(folder, "alice.py", GOOD_WARMUP + ENTRY)
    write(folder, "cheat.py", CHEAT)
    write(folder, "solver.py", SOLVER)
    os.symlink("alice.py", folder / "copycat.py")
    out = tmp_path / "out"
    result = grade_folder([folder], GradeOptions(), out=out, jobs=2)
    reports = {o.target.name: o.report for o in result.outcomes}
    assert reports["alice.py"].score == 3
    assert not reports["cheat.py"].gradable and "solver" in reports["cheat.py"].traceback
    assert not reports["copycat.py"].gradable
    assert "copycat.py is a link (to 'alice.py')" in reports["copycat.py"].traceback
    rows = {row["submission"]: row for row in csv.DictReader((out / "grades.csv").open())}
    assert rows["copycat.py"]["status"] == "not gradable" and rows["alice.py"]["score"] == "3"


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
@pytest.mark.usefixtures("stubbed")
def test_an_export_is_graded_with_its_bad_members_flagged_on_their_students(tmp_path):
    """End to end (the stand-in harness): a student's own helper reaches her process, one
    named like the standard library's copy does not (a note says why); a stored link makes
    its student not gradable; the rest of the class is graded."""
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("export/alice/cheat.py", CHEAT)
        zipped.writestr("export/alice/solver.py", SOLVER)
        zipped.writestr("export/alice/copy.py", "def deepcopy(x):\n    return x\n")
        zipped.writestr("export/carol/main.py", GOOD_WARMUP + ENTRY)
        _link("export/eve/main.py", "../carol/main.py")(zipped)
    out = tmp_path / "out"
    result = grade_folder([archive], GradeOptions(), out=out, jobs=2)
    reports = {o.target.name: o.report for o in result.outcomes}
    assert set(reports) == {"alice/cheat.py", "carol/main.py", "eve"}
    assert reports["alice/cheat.py"].score == reports["carol/main.py"].score == 3
    assert any(note.startswith("copy.py beside the submission was not given to it") and
               "the standard library's copy" in note for note in reports["alice/cheat.py"].notes)
    assert "a link stored in the archive (to '../carol/main.py')" in reports["eve"].traceback
    summary = json.loads((out / "summary.json").read_text())
    assert [row["status"] for row in summary["submissions"]] == [
        "graded", "graded", "not gradable"]


# --------------------------------------------------------------------------- imported helpers

NOTEBOOK = (Path(__file__).resolve().parents[2] / "examples" / "submissions"
            / "correct_notebook.ipynb")
UTILS = '''import torch


class KeyQueue:
    def __init__(self, capacity):
        self.capacity = capacity


def momentum_update(query, key, m):
    return None
'''


def _student_folder(root: Path, utils_name: str = "moco_utils") -> Path:
    """One student's hand-in: the LAB notebook importing its own helper module, which
    defines names of the components style (``KeyQueue``, ``momentum_update``)."""
    import nbformat

    root.mkdir(parents=True)
    notebook = nbformat.read(str(NOTEBOOK), as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(
        f"from {utils_name} import KeyQueue, momentum_update  # noqa: F401"))
    nbformat.write(notebook, str(root / "LAB07_MoCo.ipynb"))
    write(root, f"{utils_name}.py", UTILS)
    return root


def test_a_module_the_notebook_imports_is_its_helper_whatever_it_defines(tmp_path):
    folder = _student_folder(tmp_path / "alice")
    (target,) = find_targets([folder], tmp_path / "work")
    assert target.name == "LAB07_MoCo.ipynb"
    assert "helper modules it imports, not graded on their own: moco_utils.py" in target.note
    assert _copied(target.path, tmp_path, target.helpers) == ["LAB07_MoCo.ipynb",
                                                               "moco_utils.py"]


def test_the_same_student_as_a_zip_and_as_a_folder_in_a_class_export(tmp_path):
    folder = _student_folder(tmp_path / "hand-in" / "alice")
    archive = tmp_path / "alice.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in folder.iterdir():
            zipped.write(path, path.name)
        zipped.writestr("__MACOSX/._LAB07_MoCo.ipynb", b"\x00\x05\x16\x07")
        zipped.writestr(".ipynb_checkpoints/LAB07_MoCo-checkpoint.ipynb", b"{}")
    (target,) = find_targets([archive], tmp_path / "work")
    assert target.name.endswith("LAB07_MoCo.ipynb"), target.name
    assert "moco_utils.py" in _copied(target.path, tmp_path / "zip", target.helpers)
    _student_folder(tmp_path / "class" / "bob", "queue_tools")
    shutil_copy = [p.name for p in (tmp_path / "hand-in" / "alice").iterdir()]
    assert sorted(shutil_copy) == ["LAB07_MoCo.ipynb", "moco_utils.py"]
    targets = _by_name(find_targets([tmp_path / "class"], tmp_path / "work2", per_folder=True))
    assert list(targets) == ["bob/LAB07_MoCo.ipynb"]
    bob = targets["bob/LAB07_MoCo.ipynb"]
    assert _copied(bob.path, tmp_path / "bob", bob.helpers) == ["LAB07_MoCo.ipynb",
                                                                "queue_tools.py"]


def test_an_imported_file_with_the_course_style_s_entry_points_stays_a_classmate(tmp_path):
    """The rule's guard: alice importing a file that defines the LAB's own entry points (here
    the warm-up) does not make it hers."""
    folder = tmp_path / "class"
    folder.mkdir()
    write(folder, "alice.py", CHEAT)
    write(folder, "solver.py", SOLVER)
    targets = _by_name(find_targets([folder], tmp_path / "work"))
    assert set(targets) == {"alice.py", "solver.py"}
    assert _copied(targets["alice.py"].path, tmp_path, False) == ["alice.py"]
