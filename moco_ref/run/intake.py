"""A class's submissions as a learning platform exports them: which file of each student is
graded, and who the student is.

- **A ``.zip``** is unpacked (safely: no absolute or ``..`` paths, no links, bounded in size
  and count) and read as the folder it holds.
- **One folder per student** (Gradescope's "Download submissions", or any folder whose
  entries are all folders): each folder is one submission; its main file is the one that
  defines the entry points (``train_moco``, a class ``MoCo``, or the components), read from
  the source without running it; the other files beside it are its helper modules, never
  graded on their own. Gradescope's ``submission_metadata.yml`` names the students.
- **Canvas's flat download** (``login_userid_submissionid_file.py``, ``login_LATE_…``): the
  files are grouped by student; of several submissions the latest (highest submission id)
  is graded, and the report says so.
- Anything else: every ``.py``/``.ipynb`` file is a submission (``targets.folder_targets``).

``find_targets`` reads every path a batch is given this way, and refuses two submissions of
the same name.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from moco_ref.probe.source import SUBMISSION_SUFFIXES, bound_entry_points
from moco_ref.run.output import DEFAULT_OUT
from moco_ref.run.targets import Target, TargetError, folder_targets, named_targets

MAX_ZIP_BYTES = 2 << 30  # uncompressed, all members together
MAX_ZIP_MEMBERS = 50_000
GRADESCOPE_METADATA = "submission_metadata.yml"
_CANVAS = re.compile(r"^(?P<login>[^_]+)_(?:LATE_)?(?P<user>\d+)_(?P<submission>\d+)_"
                     r"(?P<file>.+)$")


@dataclass(frozen=True)
class Submission:
    path: Path  # the main file
    name: str  # stable identifier (names the report files)
    student_id: str = ""
    student_name: str = ""
    note: str = ""  # e.g. "latest of 3 submissions; helper modules: utils.py"


def find_targets(paths, workdir: Path | None = None, *, per_folder: bool = False
                 ) -> list[Target]:
    """Submissions under ``paths``: a ``.zip`` is unpacked into ``workdir`` and read as a
    folder; a platform's export (one folder per student, Canvas's flat download) gives one
    submission per student; other folders are searched recursively (``folder_targets``),
    files and module paths taken as given."""
    targets: list[Target] = []
    seen: set[str] = set()
    workdir = workdir or Path(DEFAULT_OUT) / ".intake"
    for raw in paths:
        path = Path(str(raw))
        from_zip = path.suffix == ".zip" and path.is_file()
        if from_zip:
            path = unpack_zip(path, workdir / "unpacked")
        students = class_submissions(path, workdir, per_folder=per_folder or from_zip) \
            if path.is_dir() else None
        if students:
            targets.extend(Target(str(s.path), s.name, s.student_id, s.student_name, s.note)
                           for s in students)
        elif path.is_dir():
            targets.extend(folder_targets(path))
        else:
            targets.extend(named_targets(raw))
    unique = []
    for target in targets:
        if target.name in seen:
            raise TargetError(f"two submissions are both named {target.name!r}; grade them "
                              "from separate folders or in separate runs")
        seen.add(target.name)
        unique.append(target)
    return unique


def unpack_zip(archive: Path, into: Path) -> Path:
    """``archive`` extracted under ``into/<stem>``; ``TargetError`` (one line) for a member that
    would land outside it, a link, or an archive too large."""
    target = into / archive.stem
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    try:
        with zipfile.ZipFile(archive) as zipped:
            members = zipped.infolist()
            if len(members) > MAX_ZIP_MEMBERS or sum(m.file_size for m in members) > \
                    MAX_ZIP_BYTES:
                raise TargetError(f"{archive.name}: too large to unpack ({len(members)} files)")
            for member in members:
                name = member.filename
                parts = Path(name).parts
                is_link = (member.external_attr >> 16) & 0o170000 == 0o120000
                if name.startswith(("/", "\\")) or ".." in parts or ":" in name or is_link:
                    raise TargetError(f"{archive.name}: refusing member {name!r} (absolute, "
                                      "outside the archive, or a link)")
                if name.startswith("__MACOSX/") or member.is_dir():
                    continue
                destination = target.joinpath(*parts)
                destination.parent.mkdir(parents=True, exist_ok=True)
                with zipped.open(member) as source, open(destination, "wb") as sink:
                    shutil.copyfileobj(source, sink)
    except zipfile.BadZipFile as exc:
        raise TargetError(f"{archive.name}: not a readable zip archive ({exc})") from None
    return target


def class_submissions(folder: Path, workdir: Path, *, per_folder: bool = False
                      ) -> list[Submission] | None:
    """The submissions of a platform export in ``folder``, or None when it is not one (then
    every file is a submission of its own). Folders are students when ``per_folder`` (a zip
    from a platform, or asked for) or when Gradescope's metadata file is there. Canvas's files
    are copied to ``workdir`` under their own names, one folder per student, so that a helper
    module imports."""
    entries = [p for p in sorted(folder.iterdir()) if not p.name.startswith((".", "__"))]
    students = [p for p in entries if p.is_dir()]
    files = [p for p in entries if p.is_file() and p.suffix in SUBMISSION_SUFFIXES]
    per_folder = per_folder or (folder / GRADESCOPE_METADATA).is_file()
    if students and not files and len(students) == 1 and per_folder:
        only = class_submissions(students[0], workdir, per_folder=True)  # the zip's own folder
        if only is not None:
            return only
    if per_folder and students and not files:
        metadata = _gradescope_metadata(folder / GRADESCOPE_METADATA)
        found = [s for s in (_from_folder(p, metadata.get(p.name, {})) for p in students) if s]
        return found or None
    canvas = [p for p in files if _CANVAS.match(p.name)]
    if files and len(canvas) == len(files):
        return _from_canvas(canvas, workdir / "canvas")
    return None


def _from_folder(folder: Path, who: dict) -> Submission | None:
    candidates = sorted(p for p in folder.rglob("*") if p.is_file()
                        and p.suffix in SUBMISSION_SUFFIXES and not p.name.startswith((".", "_"))
                        and ".ipynb_checkpoints" not in p.parts)
    if not candidates:
        return None
    main = main_file(candidates)
    helpers = [p.name for p in candidates if p != main]
    note = f"helper modules beside it, not graded on their own: {', '.join(helpers)}" \
        if helpers else ""
    return Submission(main, f"{folder.name}/{main.relative_to(folder).as_posix()}",
                      who.get("sid", ""), who.get("name", ""), note)


def main_file(candidates: list[Path]) -> Path:
    """The file that defines the most entry points (ties: a notebook, then the shorter path)."""
    return max(candidates, key=lambda p: (len(bound_entry_points(p)), p.suffix == ".ipynb",
                                          -len(p.as_posix())))


def _gradescope_metadata(path: Path) -> dict[str, dict]:
    """``{folder: {"sid", "name"}}`` from Gradescope's export (keys written as Ruby symbols,
    ``:submitters:``); empty when there is none or it cannot be read."""
    if not path.is_file():
        return {}
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except Exception:  # noqa: BLE001 - the grades do not depend on it
        return {}
    found = {}
    for folder, entry in data.items() if isinstance(data, dict) else ():
        submitters = (entry or {}).get(":submitters") or (entry or {}).get("submitters") or []
        people = [s for s in submitters if isinstance(s, dict)]
        if people:
            found[str(folder)] = {
                "sid": ";".join(str(p.get(":sid") or p.get("sid") or "") for p in people),
                "name": ";".join(str(p.get(":name") or p.get("name") or "") for p in people),
            }
    return found


# Canvas names a repeated upload "file-1.py"
_CANVAS_COPY = re.compile(r"^(?P<stem>.+?)-\d+(?P<suffix>\.[A-Za-z]+)$")


def _original_name(name: str) -> str:
    match = _CANVAS_COPY.match(name)
    return match["stem"] + match["suffix"] if match else name


def _from_canvas(files: list[Path], workdir: Path) -> list[Submission]:
    by_student: dict[str, list[tuple[int, Path, str]]] = {}
    for path in files:
        match = _CANVAS.match(path.name)
        by_student.setdefault(match["user"], []).append(
            (int(match["submission"]), path, match["login"]))
    submissions = []
    for user, entries in sorted(by_student.items()):
        latest = max(entry[0] for entry in entries)
        folder = workdir / user
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        attempt = []
        for number, path, login in entries:
            if number == latest:
                copy = folder / _original_name(_CANVAS.match(path.name)["file"])
                shutil.copyfile(path, copy)
                attempt.append((number, copy, login))
        main = main_file([path for _, path, _ in attempt])
        notes = []
        earlier = sorted({entry[0] for entry in entries} - {latest})
        if earlier:
            notes.append(f"latest of {len(earlier) + 1} submissions (submission {latest}; "
                         f"earlier: {', '.join(map(str, earlier))})")
        helpers = [path.name for _, path, _ in attempt if path != main]
        if helpers:
            notes.append(f"helper modules beside it, not graded on their own: "
                         f"{', '.join(helpers)}")
        submissions.append(Submission(main, f"{user}/{main.name}", user, attempt[0][2],
                                      "; ".join(notes)))
    return submissions
