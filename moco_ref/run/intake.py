"""A class's submissions as a learning platform exports them: which file of each student is
graded, and who the student is.

- **A ``.zip``** is unpacked safely (``archive.unpack_zip``); a bad member is skipped and
  flagged on its own student only (``archive.Skipped``): the rest of the class is unpacked
  and graded as usual.
- **One folder per student** (Gradescope's "Download submissions", or any folder whose
  entries are all folders): each folder is one submission; its main file is the one that
  defines the entry points (``train_moco``, a class ``MoCo``, or the components), read from
  the source without running it; the helper modules beside it (``sandbox.attempt.
  helper_files``) are its own, never graded on their own. Gradescope's
  ``submission_metadata.yml`` names the students.
- **Canvas's flat download** (``login_userid_submissionid_file.py``, ``login_LATE_…``): the
  files are grouped by student; of several submissions the latest (highest submission id)
  is graded, and the report says so.
- Anything else: every ``.py``/``.ipynb`` file is a submission (``targets.folder_targets``),
  none another's helper.

**Students never share code paths.** A link is never followed, wherever it points (even
inside the student's own folder): a student's folder that is a link, or a link among a
student's files, is refused and named in that student's report; when what is left defines
no entry point (their main file was the link) the student is "not gradable" with the
reason. A student flagged this way is a ``Target`` with ``refused`` set: batch grading gives
it a not-gradable report without running anything, so it has its row in the summaries.

``find_targets`` reads every path a batch is given this way, and refuses two submissions of
the same name.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from moco_ref.probe.source import (
    SUBMISSION_SUFFIXES,
    bound_entry_points,
    imported_helper,
    is_module_target,
)
from moco_ref.run.archive import Skipped, unpack_zip
from moco_ref.run.gradescope_metadata import gradescope_metadata
from moco_ref.run.output import DEFAULT_OUT
from moco_ref.run.targets import (
    Student,
    Target,
    TargetError,
    folder_targets,
    link_text,
    named_targets,
    reached_through_link,
)

MAX_LISTED = 5  # refused files named in a note; the rest counted
GRADESCOPE_METADATA = "submission_metadata.yml"
_CANVAS = re.compile(r"^(?P<login>[^_]+)_(?P<late>LATE_)?(?P<user>\d+)_(?P<submission>\d+)_"
                     r"(?P<file>.+)$")
_UNSAFE_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]")
_NO_ENTRY_POINT = "none of the other files defines an entry point (train_moco, MoCo, …)"


@dataclass(frozen=True)
class Submission:
    path: Path  # the main file (a refused student: their folder, or where it would be)
    name: str  # stable identifier (names the report files)
    student_id: str = ""
    student_name: str = ""
    note: str = ""  # e.g. "latest of 3 submissions; helper modules: utils.py"
    refused: str = ""  # why the student is not gradable, without running anything
    students: tuple[Student, ...] = ()  # who, from the export (several for a group)


def find_targets(paths, workdir: Path | None = None, *, per_folder: bool = False
                 ) -> list[Target]:
    """Submissions under ``paths``: a ``.zip`` is unpacked into ``workdir`` and read as a
    folder; a platform's export (one folder per student, Canvas's flat download) gives one
    submission per student; other folders are searched recursively (``folder_targets``),
    files and module paths taken as given (several files of one folder are classmates: none
    is another's helper). Refused students and archive members keep their row (``Target.
    refused``)."""
    targets: list[Target] = []
    given: list[Target] = []  # files and module paths as given
    seen: set[str] = set()
    workdir = workdir or Path(DEFAULT_OUT) / ".intake"
    for raw in paths:
        path = Path(str(raw))
        skipped: list[Skipped] = []
        from_zip = path.suffix == ".zip" and path.is_file()
        if from_zip:
            path, skipped = unpack_zip(path, workdir / "unpacked")
            skipped = [s for s in skipped if not _hidden(s.parts)]
        students = class_submissions(path, workdir, per_folder=per_folder or from_zip,
                                     skipped=skipped) if path.is_dir() else None
        if students:
            found = [_target_of(s) for s in students]
        elif path.is_dir():
            found = _flat_targets(path, skipped)
        else:
            found = named_targets(raw)
            given.extend(found)
        targets.extend(_refused_renamed_apart(found))
    unique = []
    for target in _classmates_given_apart(targets, given):
        if target.name in seen:
            raise TargetError(f"two submissions are both named {target.name!r}; grade them "
                              "from separate folders or in separate runs")
        seen.add(target.name)
        unique.append(target)
    return unique


def _hidden(parts: tuple[str, ...]) -> bool:
    """Whether a path lies in a hidden folder or is a hidden file (never read as a
    submission, so never flagged either)."""
    return any(part.startswith(".") and part != ".." for part in parts)


def _target_of(submission: Submission) -> Target:
    return Target(str(submission.path), submission.name, submission.student_id,
                  submission.student_name, submission.note, refused=submission.refused,
                  students=submission.students)


def _flat_targets(folder: Path, skipped: list[Skipped]) -> list[Target]:
    """A folder of classmates' files (``folder_targets``), and a refused row for each member of
    its archive that was not unpacked (each file is a student of its own)."""
    try:
        found = folder_targets(folder)
    except TargetError:
        if not skipped:
            raise
        found = []
    return found + [_target_of(row) for row in _refused_rows(folder, skipped)]


def _classmates_given_apart(targets: list[Target], given: list[Target]) -> list[Target]:
    """Files ``given`` one by one that lie in one folder are classmates side by side, as in a
    class folder: none of them gets helper modules from that folder (``helpers=False``). A
    single file given directly keeps its helpers."""
    files = [t for t in given if not is_module_target(t.path)]
    folders = [Path(t.path).resolve().parent for t in files]
    shared = {folder for folder in folders if folders.count(folder) > 1}
    apart = {id(t) for t, folder in zip(files, folders, strict=True) if folder in shared}
    return [replace(t, helpers=False) if id(t) in apart else t for t in targets]


def _refused_renamed_apart(targets: list[Target]) -> list[Target]:
    """The targets of one path with every refused one named apart from the others (``~2``,
    ``~3`` appended): a refused member's name, made safe, may meet a student's; the
    students' own names never change."""
    taken = {t.name for t in targets if not t.refused}
    renamed = []
    for target in targets:
        if target.refused:
            name, number = target.name, 1
            while name in taken:
                number += 1
                name = f"{target.name}~{number}"
            taken.add(name)
            target = replace(target, name=name)
        renamed.append(target)
    return renamed


# --------------------------------------------------------------------------- exports


def class_submissions(folder: Path, workdir: Path, *, per_folder: bool = False,
                      skipped: list[Skipped] = ()) -> list[Submission] | None:
    """The submissions of a platform export in ``folder``, or None when it is not one (then
    every file is a submission of its own). Folders are students when ``per_folder`` (a zip
    from a platform, or asked for) or when Gradescope's metadata file is there. Canvas's files
    are copied to ``workdir`` under their own names, one folder per student, so that a helper
    module imports. ``skipped``: the members of its archive that were not unpacked, each
    flagged on its own student (the folder, or the Canvas upload, it was written in) or, when
    it names none, as a refused row of its own."""
    entries = [p for p in sorted(folder.iterdir()) if not p.name.startswith((".", "__"))]
    students = [p for p in entries if p.is_dir()]  # a link to a folder too: refused later
    files = [p for p in entries if not p.is_dir() and p.suffix in SUBMISSION_SUFFIXES
             and (p.is_file() or p.is_symlink())]
    present = {p.name for p in entries}
    vanished = sorted({s.parts[0] for s in skipped if len(s.parts) > 1
                       and s.parts[0] not in present
                       and not s.parts[0].startswith((".", "__"))})
    per_folder = per_folder or (folder / GRADESCOPE_METADATA).is_file()
    if per_folder and len(students) == 1 and not vanished and not files \
            and not students[0].is_symlink():
        inside = [s.within(students[0].name) for s in skipped]
        only = class_submissions(students[0], workdir, per_folder=True,
                                 skipped=[s for s in inside if s])  # the zip's own folder
        if only is not None:
            return only + _refused_rows(folder, [s for s, i in zip(skipped, inside,
                                                                   strict=True) if not i])
    if per_folder and (students or vanished) and not files:
        metadata = gradescope_metadata(folder / GRADESCOPE_METADATA)
        found = [_from_folder(p, metadata.get(p.name, {}),
                              [k for k in (s.within(p.name) for s in skipped) if k])
                 for p in students]
        for name in vanished:
            reasons = [s.reason for s in skipped if s.parts[0] == name]
            found.append(Submission(folder / _safe_name((name,)), _safe_name((name,)),
                                    refused=_refusal_text(_safe_name((name,)), reasons, []),
                                    **_who(metadata.get(name, {}))))
        placed = {p.name for p in students} | set(vanished)
        found += _refused_rows(folder, [s for s in skipped if not (
            len(s.parts) > 1 and s.parts[0] in placed)])
        found += _absent_rows(folder, metadata, placed | {p.name for p in entries})
        return sorted(found, key=lambda s: s.name) or None
    canvas = [p for p in files if _CANVAS.match(p.name)]
    others = [p for p in entries if not p.is_dir() and p.suffix not in SUBMISSION_SUFFIXES
              and _CANVAS.match(p.name) and (p.is_file() or p.is_symlink())]
    if (files or others) and len(canvas) == len(files) and not (students and not files):
        uploads = [s for s in skipped if len(s.parts) == 1 and _CANVAS.match(s.parts[0])]
        return _from_canvas(canvas + others, workdir / "canvas", uploads) + _refused_rows(
            folder, [s for s in skipped if s not in uploads])
    return None


def _who(entry: dict) -> dict:
    return {"student_id": entry.get("sid", ""), "student_name": entry.get("name", ""),
            "students": entry.get("students", ())}


def _absent_rows(root: Path, metadata: dict[str, dict], present: set[str]
                 ) -> list[Submission]:
    """A not-gradable row for each submission the export's metadata names but whose folder
    is not in the export: its students are on the roster, with nothing handed in."""
    return [Submission(root / _safe_name((name,)), _safe_name((name,)),
                       refused=f"{_safe_name((name,))}: not gradable: nothing was handed in "
                       "(the export's metadata names this submission; the export holds no "
                       "files of it)", **_who(entry))
            for name, entry in sorted(metadata.items()) if name not in present]


def _nothing_gradable(shown: str, files: list[str]) -> str:
    """Why a submission holding no ``.py``/``.ipynb`` file is not gradable: what it holds."""
    if not files:
        return f"{shown}: not gradable: the submission holds no files"
    listed = ", ".join(files[:MAX_LISTED]) + (f" and {len(files) - MAX_LISTED} more"
                                              if len(files) > MAX_LISTED else "")
    return (f"{shown}: not gradable: no .py file and no .ipynb notebook in the submission "
            f"(it holds {listed})")


def _is_empty(path: Path) -> bool:
    try:
        return not path.read_bytes().strip()
    except OSError:
        return False


def _refused_rows(root: Path, skipped: list[Skipped]) -> list[Submission]:
    """A refused row for each skipped member no student was found for, named by its path
    made safe (``_safe_name``)."""
    return [Submission(root / _safe_name(s.parts), _safe_name(s.parts), refused=s.reason)
            for s in skipped]


def _safe_name(parts: tuple[str, ...]) -> str:
    """A member's path as a name a report file can carry: letters, digits, ``._-`` (others
    become ``_``), each part at most 80 characters, no ``.``/``..`` parts."""
    safe = [_UNSAFE_NAME_CHARACTERS.sub("_", part)[:80] for part in parts]
    return "/".join("_" if part in ("", ".", "..") else part for part in safe) or "_"


def _refusal_text(student: str, reasons: list[str], remaining: list[Path]) -> str:
    """Why ``student`` is not gradable: what was refused, and (when files are left) that
    none of them defines an entry point."""
    left = f"; {_NO_ENTRY_POINT}" if remaining else ""
    return f"{student}: not gradable: " + "; ".join(dict.fromkeys(reasons)) + left


def _refused_note(reasons: list[str]) -> str:
    """The note of a graded student some of whose files were refused: the first few named."""
    reasons = list(dict.fromkeys(reasons))
    listed = reasons[:MAX_LISTED]
    more = f"; and {len(reasons) - MAX_LISTED} more" if len(reasons) > MAX_LISTED else ""
    return "refused (not graded, not given to the submission): " + "; ".join(listed) + more


def _from_folder(folder: Path, who: dict, skipped: list[Skipped] = ()) -> Submission:
    """One student's folder as a submission: its main file, its helpers named in the note,
    its links and ``skipped`` members refused and named (``Submission.refused`` when what is
    left defines no entry point). A folder holding no ``.py``/``.ipynb`` file (a PDF, a text
    file, nothing), or only empty ones, is a refused row with what it holds: every student
    of the export has a row."""
    student = _who(who)
    if folder.is_symlink():
        return Submission(folder, folder.name, refused=f"{folder.name}: not gradable: "
                          f"{link_text(folder, folder.name)}; a student's folder that is a "
                          "link is not followed (it could lead to a classmate's)", **student)
    candidates, links = _own_files(folder)
    reasons = [f"{link_text(link, link.relative_to(folder).as_posix())}, not followed"
               for link in links] + [s.reason for s in skipped]
    if not candidates:
        return Submission(folder, folder.name, refused=_refusal_text(
            folder.name, reasons, []) if reasons else _nothing_gradable(
            folder.name, _held_files(folder)), **student)
    if not reasons and all(_is_empty(path) for path in candidates):
        shown = ", ".join(p.relative_to(folder).as_posix() for p in candidates[:MAX_LISTED])
        return Submission(folder, folder.name, refused=f"{folder.name}: not gradable: "
                          f"{shown} {'is' if len(candidates) == 1 else 'are'} empty (a lab "
                          "submission defines train_moco and moco_warmup, a builder "
                          "submission a class MoCo)", **student)
    main = main_file(candidates)
    if reasons and not bound_entry_points(main):
        return Submission(folder, folder.name, refused=_refusal_text(
            folder.name, reasons, candidates), **student)
    notes = [_files_note(main, candidates, folder)] + ([_refused_note(reasons)] if reasons
                                                        else [])
    return Submission(main, f"{folder.name}/{main.relative_to(folder).as_posix()}",
                      note="; ".join(note for note in notes if note), **student)


def _own_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """A student's folder read without following links: ``(candidates, links)`` — the
    submission files it really holds (hidden, private and checkpoint files left out), and
    the links in it (outside hidden folders), sorted."""
    candidates, links = [], []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if reached_through_link(folder, relative) or any(part.startswith(".")
                                                   for part in relative.parts[:-1]):
            continue
        if path.is_symlink():
            if not path.name.startswith("."):
                links.append(path)
        elif path.is_file() and path.suffix in SUBMISSION_SUFFIXES \
                and not path.name.startswith((".", "_")) \
                and ".ipynb_checkpoints" not in path.parts:
            candidates.append(path)
    return candidates, links


def _held_files(folder: Path) -> list[str]:
    """The files a student's folder holds (outside hidden folders, links not followed)."""
    held = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if reached_through_link(folder, relative) or any(part.startswith(".")
                                                   for part in relative.parts):
            continue
        if path.is_file() and not path.is_symlink():
            held.append(relative.as_posix())
    return held


def _files_note(main: Path, candidates: list[Path], folder: Path) -> str:
    """Which of a student's other files are the main file's helper modules (they reach its
    process) and which are neither graded nor given to it (a second file that binds entry
    points, one in another folder, a notebook)."""
    from moco_ref.sandbox.attempt import helper_files

    helpers = helper_files(main)
    given = {p.resolve() for p in [main, *helpers]}
    others = [p.relative_to(folder).as_posix() for p in candidates if p.resolve() not in given]
    notes = []
    if helpers:
        notes.append("helper modules beside it, not graded on their own: "
                     + ", ".join(p.name for p in helpers))
    if others:
        notes.append("other files, neither graded nor its helpers: " + ", ".join(others))
    return "; ".join(notes)


def main_file(candidates: list[Path]) -> Path:
    """The file that defines the most entry points (ties: a notebook, then the shorter path),
    among those no other file imports as its helper (``imported_helper``)."""
    imported = {helper for helper in candidates for main in candidates
                if helper != main and helper.parent == main.parent
                and imported_helper(helper, main)}
    return max([p for p in candidates if p not in imported] or candidates,
               key=lambda p: (len(bound_entry_points(p)), p.suffix == ".ipynb",
                              -len(p.as_posix())))


# Canvas names a repeated upload "file-1.py"
_CANVAS_COPY = re.compile(r"^(?P<stem>.+?)-\d+(?P<suffix>\.[A-Za-z]+)$")


def _original_name(name: str) -> str:
    match = _CANVAS_COPY.match(name)
    return match["stem"] + match["suffix"] if match else name


def _from_canvas(files: list[Path], workdir: Path, skipped: list[Skipped] = ()
                 ) -> list[Submission]:
    """Canvas's uploads grouped by student (the user id of the file name: each student once),
    each student's latest ``.py``/``.ipynb`` upload graded. An upload that is a link, or a
    ``skipped`` member, is refused and named on its student (not gradable when nothing of
    theirs is left); a student who uploaded only other files (a PDF, a text) is not gradable,
    with what they uploaded. Late when the graded upload's name says ``LATE_``."""
    by_student: dict[str, list[tuple[int, Path, str, bool]]] = {}
    refusals: dict[str, list[str]] = {}
    logins: dict[str, str] = {}
    others: dict[str, list[tuple[int, str, bool]]] = {}
    for path in files:
        match = _CANVAS.match(path.name)
        user, number, late = match["user"], int(match["submission"]), bool(match["late"])
        logins.setdefault(user, match["login"])
        if path.is_symlink():
            refusals.setdefault(user, []).append(f"{link_text(path, path.name)}, not followed")
        elif path.suffix not in SUBMISSION_SUFFIXES:
            others.setdefault(user, []).append((number, match["file"], late))
        else:
            by_student.setdefault(user, []).append((number, path, match["login"], late))
    for member in skipped:
        match = _CANVAS.match(member.parts[0])
        logins.setdefault(match["user"], match["login"])
        refusals.setdefault(match["user"], []).append(member.reason)
    submissions = []
    for user in sorted(set(by_student) | set(refusals) | set(others)):
        entries = by_student.get(user)
        if not entries:
            uploads = sorted(others.get(user, ()))
            late = uploads[-1][2] if uploads else None
            refused = _refusal_text(user, refusals[user], []) if user in refusals else \
                _nothing_gradable(user, [name for _, name, _ in uploads])
            submissions.append(Submission(workdir / user, user, user, logins[user],
                                          refused=refused,
                                          students=(Student(user, logins[user], late, "canvas"),)))
            continue
        submission = _latest_upload(user, entries, workdir)
        if user in refusals:
            submission = replace(submission, note="; ".join(
                note for note in (submission.note, _refused_note(refusals[user])) if note))
        submissions.append(submission)
    return submissions


def _latest_upload(user: str, entries: list[tuple[int, Path, str, bool]], workdir: Path
                   ) -> Submission:
    """A Canvas student's latest upload copied into ``workdir/<user>`` under its own names,
    as a submission (the note says which of several it is, and its helpers)."""
    latest = max(entry[0] for entry in entries)
    folder = workdir / user
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    attempt = []
    for number, path, login, late in entries:
        if number == latest:
            copy = folder / _original_name(_CANVAS.match(path.name)["file"])
            shutil.copyfile(path, copy)
            attempt.append((number, copy, login, late))
    main = main_file([path for _, path, _, _ in attempt])
    notes = []
    earlier = sorted({entry[0] for entry in entries} - {latest})
    late = any(entry[3] for entry in attempt)
    if earlier:
        notes.append(f"latest of {len(earlier) + 1} submissions (submission {latest}"
                     + (", late" if late else "") + f"; earlier: {', '.join(map(str, earlier))})")
    notes.append(_files_note(main, [path for _, path, _, _ in attempt], folder))
    login = attempt[0][2]
    return Submission(main, f"{user}/{main.name}", user, login,
                      "; ".join(note for note in notes if note),
                      students=(Student(user, login, late, "canvas"),))
