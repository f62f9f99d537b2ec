"""What a user points the grader at, named: which paths and module names are submissions, the
stable name of each (it names its report files and decides its shard), the shards, and which
submissions ``--only`` chooses.

- **targets**: files and module paths as given; a folder's ``*.py``/``*.ipynb`` files (one
  level for ``grade``, recursively for a batch), sorted, leaving out hidden, private and
  test-config files. A target's *name* is its path relative to the folder it was found in
  (or its file name / module path).
- **shards**: ``--shard i/n`` keeps the targets whose name hashes to ``i`` (``sha256`` of the
  name, mod ``n``; 1-based ``i``): stable across machines, Python versions and reorderings,
  and every target lands in exactly one shard.

Nothing here runs submission code: a module path is checked to be importable without being
imported.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from moco_ref.probe.source import SUBMISSION_SUFFIXES, imported_helper, is_module_target

_SKIPPED_FILE_NAMES = {"conftest.py", "setup.py"}
_SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", ".git", ".hypothesis"}


class TargetError(ValueError):
    """A path or module name that names no submission (a usage error, not a grade)."""


@dataclass(frozen=True)
class Target:
    path: str  # what is graded: a file path or a module path
    name: str  # stable identifier: relative path (or module path); names the report files
    student_id: str = ""  # from the platform's export, when it says
    student_name: str = ""
    note: str = ""  # how the file was chosen (latest of several, helper modules beside it)
    helpers: bool = True  # may the .py files beside it be its helpers (its own folder)?
    refused: str = ""  # why it is not gradable without running anything (a link, a bad member)
    # who handed it in, from the export's metadata (several for a group submission)
    students: tuple[Student, ...] = ()

    def roster(self) -> tuple[Student, ...]:
        """Its students: the export's (``students``, one per member of a group), else one
        from ``student_id`` and ``student_name``, else none (a plain class folder)."""
        if self.students:
            return self.students
        if self.student_id or self.student_name:
            return (Student(self.student_id, self.student_name),)
        return ()


@dataclass(frozen=True)
class Student:
    """One student of a submission, as the export names them."""

    id: str = ""  # Gradescope's SID, Canvas's user id
    name: str = ""
    late: bool | None = None  # None: the export does not say
    platform: str = ""  # whose id: "canvas" (Canvas's user id), "gradescope" (the SID)

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "late": self.late,
                "platform": self.platform}

    def label(self) -> str:
        """``Ada Lovelace (9001)``; the name or the id alone when only one is known."""
        if self.name and self.id:
            return f"{self.name} ({self.id})"
        return self.name or self.id


# --------------------------------------------------------------------------- which targets


def expand_targets(paths) -> list[str]:
    """Files and module names as given; each folder becomes its ``*.py``/``*.ipynb`` files,
    sorted, leaving out ``__init__``, private, hidden and test-config files.

    Raises ``TargetError`` for a missing path or a folder without submissions.
    """
    targets: list[str] = []
    for raw in paths:
        target = str(raw)
        path = Path(target)
        if path.is_dir():
            found = sorted(
                str(child)
                for child in path.iterdir()
                if child.is_file()
                and child.suffix in SUBMISSION_SUFFIXES
                and not child.name.startswith(("_", "."))
                and child.name not in _SKIPPED_FILE_NAMES
            )
            if not found:
                raise TargetError(f"no submissions (*.py or *.ipynb files) in folder {target}")
            targets.extend(found)
        elif path.is_file():
            if path.suffix not in SUBMISSION_SUFFIXES:
                raise TargetError(f"{target} is neither a .py file nor a .ipynb notebook")
            targets.append(target)
        elif is_module_target(target) and _importable(target):
            targets.append(target)
        else:
            raise TargetError(f"no such file, folder or importable module: {target}")
    return targets


def _importable(module_path: str) -> bool:
    """Whether the top-level package of ``module_path`` can be found, from the current folder
    or the installed ones — without importing anything (no submission code runs here)."""
    head = module_path.split(".")[0]
    try:
        return (
            importlib.machinery.PathFinder.find_spec(head, [os.getcwd()]) is not None
            or importlib.util.find_spec(head) is not None
        )
    except (ImportError, ValueError):
        return False


def folder_targets(path: Path) -> list[Target]:
    """Every submission file under the folder ``path``, recursively and sorted, each named by
    its path relative to ``path`` (hidden, private and test-config files, and the files of
    hidden or cache folders, left out, as ``expand_targets`` does for one level).

    The files are classmates' side by side: none is another's helper module
    (``helpers=False``). A link there (a submission file's name, or a folder; wherever it
    points) is not followed: it is a target of its own, refused with where it points."""
    found = []
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path)
        if any(part.startswith(".") or part in _SKIPPED_DIRS for part in relative.parts[:-1]):
            continue
        if file.name.startswith(("_", ".")) or file.name in _SKIPPED_FILE_NAMES \
                or reached_through_link(path, relative):
            continue
        if file.is_symlink():
            if file.suffix in SUBMISSION_SUFFIXES or file.is_dir():
                found.append(Target(str(file), relative.as_posix(), helpers=False,
                                    refused=f"{link_text(file, relative.as_posix())}: a link "
                                    "in a class folder is not followed (it could lead to a "
                                    "classmate's file); put the file itself there"))
        elif file.is_file() and file.suffix in SUBMISSION_SUFFIXES:
            found.append(Target(str(file), relative.as_posix(), helpers=False))
    if not found:
        raise TargetError(f"no submissions (*.py or *.ipynb files) in folder {path}")
    return _without_imported_helpers(found)


def _without_imported_helpers(found: list[Target]) -> list[Target]:
    """A module another file of the same folder imports, that is no submission of that
    file's style (``imported_helper``: a student's ``moco_utils.py`` defining ``KeyQueue``
    beside the notebook that imports it), is that file's helper: not graded on its own, and
    named in the importer's note."""
    files = [t for t in found if not t.refused]
    helper_of: dict[int, list[str]] = {}
    helpers: set[int] = set()
    for target in files:
        folder = Path(target.path).parent
        for other in files:
            if other is not target and Path(other.path).parent == folder \
                    and imported_helper(Path(other.path), Path(target.path)):
                helper_of.setdefault(id(target), []).append(Path(other.path).name)
                helpers.add(id(other))
    kept = []
    for target in found:
        if id(target) in helpers and id(target) not in helper_of:
            continue
        names = helper_of.get(id(target))
        kept.append(replace(target, note="; ".join(filter(None, [
            target.note, "helper modules it imports, not graded on their own: "
            + ", ".join(names)]))) if names else target)
    return kept


def reached_through_link(root: Path, relative: Path) -> bool:
    """Whether one of the folders between ``root`` and ``root/relative`` is a link."""
    return any(root.joinpath(*relative.parts[:depth]).is_symlink()
               for depth in range(1, len(relative.parts)))


def link_text(link: Path, shown: str) -> str:
    """``shown is a link to '…'``: what the link says (read, not followed), capped."""
    try:
        points = os.readlink(link)
    except OSError as exc:
        points = f"? ({exc.strerror})"
    return f"{shown} is a link (to {points[:300]!r})"


def named_targets(raw) -> list[Target]:
    """A file, a module path or a folder (one level) as given, each named by its file name
    (a module path: itself)."""
    return [Target(target, target if is_module_target(target) else Path(target).name)
            for target in expand_targets([raw])]


# --------------------------------------------------------------------------- names


def student_label(target: Target) -> str:
    """Who a submission is, for tables and reports: its students' names (``label``),
    ``, ``-joined for a group; the submission's name when the export names no one."""
    labels = [student.label() for student in target.roster() if student.label()]
    return ", ".join(labels) or target.name


_UNSAFE_STEM = re.compile(r"[^A-Za-z0-9._-]+")


def feedback_stem(target: Target) -> str:
    """The stem of a submission's feedback page: its students' names and ids made safe
    (``Ada_Lovelace-9001``, ``+``-joined for a group), so a teacher can hand each student
    theirs; ``report_stem`` when the export names no one."""
    parts = []
    for student in target.roster():
        words = "-".join(w for w in (student.name, student.id) if w)
        safe = _UNSAFE_STEM.sub("_", words).strip("._")[:80]
        if safe:
            parts.append(safe)
    if not parts:
        return report_stem(target)
    named_apart = all(student.id for student in target.roster())  # ids are unique, names not
    return "+".join(parts) + ("" if named_apart else f"__{report_stem(target)}")


def report_stem(target: Target) -> str:
    """``sub/alice.py`` → ``sub__alice.py``: one flat folder of reports."""
    return target.name.replace("/", "__").replace("\\", "__")


def chosen_by(target: Target, only) -> bool:
    """Whether ``--only`` names this submission: its name, file stem, folder or student id."""
    names = {target.name, Path(target.name).stem, target.name.split("/", 1)[0]}
    names |= set(target.student_id.split(";")) - {""}
    return bool(names & set(only))


# --------------------------------------------------------------------------- shards


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/5"`` → ``(2, 5)``; 1-based."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard wants i/n (e.g. 2/5), got {text!r}") from None
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--shard {text}: need 1 ≤ i ≤ n")
    return index, count


def shard_of(name: str, count: int) -> int:
    """The 1-based shard a target's name falls in."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1
