"""An exported class's ``.zip`` unpacked safely: bounded in size and count, nothing ever
written outside its folder, no link unpacked. A bad member — a link stored in the archive, an
absolute or ``..`` path, a name the file system refuses, two members of one name, a file
where other members need a folder of its name, one that cannot be read — is skipped and
returned as a ``Skipped`` (the member and why), so that the intake flags only its own
student (``intake.class_submissions``) and the rest of the class is unpacked as usual.
"""

from __future__ import annotations

import shutil
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from moco_ref.run.targets import TargetError

MAX_ZIP_BYTES = 2 << 30  # uncompressed, all members together
MAX_ZIP_MEMBERS = 50_000


@dataclass(frozen=True)
class Skipped:
    """A member of an exported archive that was not unpacked."""

    parts: tuple[str, ...]  # its path as the archive writes it, split at "/"
    reason: str  # names the member and what is wrong with it

    def within(self, folder: str) -> Skipped | None:
        """The same member seen from inside the archive's folder ``folder``, or None when it
        does not lie there."""
        if len(self.parts) > 1 and self.parts[0] == folder:
            return Skipped(self.parts[1:], self.reason)
        return None


def unpack_zip(archive: Path, into: Path) -> tuple[Path, list[Skipped]]:
    """``archive`` extracted under ``into/<stem>``: that folder, and the members that were not
    extracted (``Skipped``, each naming the member and why): a link, an absolute or ``..``
    path, a name the file system refuses, two members of one name, a file where other members
    need a folder of its name, one that cannot be read. Nothing is ever written outside the
    folder. ``TargetError`` (one line) only for an archive that cannot be read at all or is
    too large."""
    target = into / archive.stem
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    skipped: list[Skipped] = []
    try:
        with zipfile.ZipFile(archive) as zipped:
            members = zipped.infolist()
            if len(members) > MAX_ZIP_MEMBERS or sum(m.file_size for m in members) > \
                    MAX_ZIP_BYTES:
                raise TargetError(f"{archive.name}: too large to unpack ({len(members)} files)")
            files = []
            for member in members:
                if member.filename.startswith("__MACOSX/") or member.is_dir():
                    continue
                why = _member_refusal(zipped, member)
                if why:
                    skipped.append(_skipped(member.filename, why))
                else:
                    files.append(member)
            files, clashing = _without_clashes(files)
            skipped.extend(clashing)
            for member in files:
                why = _write_member(zipped, member, target)
                if why:
                    skipped.append(_skipped(member.filename, why))
    except (zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise TargetError(f"{archive.name}: not a readable zip archive ({exc})") from None
    return target, skipped


def _skipped(name: str, why: str) -> Skipped:
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    shown = repr(name) if len(name) <= 200 else repr(name[:200]) + "…"
    return Skipped(parts, f"the export's member {shown} was not unpacked: {why}")


def _member_refusal(zipped: zipfile.ZipFile, member: zipfile.ZipInfo) -> str:
    """Why ``member`` may not be unpacked, read from its header alone; ``""`` when it may."""
    name = member.filename
    if (member.external_attr >> 16) & 0o170000 == 0o120000:
        return f"it is a link stored in the archive (to {_stored_link(zipped, member)!r}); " \
               "links are never unpacked"
    if "\x00" in name:
        return "its name holds a NUL character, which no file name may"
    if name.startswith(("/", "\\")) or ":" in name:
        return "its path is absolute (or names a drive)"
    if ".." in PurePosixPath(name).parts:
        return "its path leads out of the archive's folder (..)"
    return ""


def _stored_link(zipped: zipfile.ZipFile, member: zipfile.ZipInfo) -> str:
    """Where a link stored in the archive points (its content), capped; ``?`` when it cannot
    be read."""
    if member.file_size > 4096:
        return "?"
    try:
        return zipped.read(member).decode("utf-8", "replace")[:300]
    except Exception:  # noqa: BLE001 - only shown as evidence
        return "?"


def _without_clashes(members: list[zipfile.ZipInfo]
                     ) -> tuple[list[zipfile.ZipInfo], list[Skipped]]:
    """``members`` without those whose path another member also has (all of them: which one
    is the student's cannot be told) and those that are a file where other members need a
    folder of that name; and those left out, with why. Order-free."""
    paths = [PurePosixPath(member.filename).parts for member in members]
    folders = {path[:depth] for path in paths for depth in range(1, len(path))}
    kept, clashing = [], []
    for member, path in zip(members, paths, strict=True):
        count = paths.count(path)
        if count > 1:
            clashing.append(_skipped(member.filename, f"the archive holds {count} members of "
                                     "that name; which is the student's cannot be told"))
        elif path in folders:
            clashing.append(_skipped(member.filename, "it is a file where other members of "
                                     "the archive need a folder of that name"))
        else:
            kept.append(member)
    return kept, clashing


def _write_member(zipped: zipfile.ZipFile, member: zipfile.ZipInfo, folder: Path) -> str:
    """``member`` written under ``folder`` (never over an existing file); ``""``, or why it
    could not be (nothing of it is left behind)."""
    destination = folder.joinpath(*PurePosixPath(member.filename).parts)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        with zipped.open(member) as source, open(destination, "xb") as sink:
            shutil.copyfileobj(source, sink)
        return ""
    except OSError as exc:
        why = f"the file system refuses it ({exc.strerror or exc})"
    except (zipfile.BadZipFile, RuntimeError, NotImplementedError, EOFError, ValueError,
            zlib.error) as exc:
        why = f"it cannot be read from the archive ({type(exc).__name__}: {exc})"[:300]
    try:
        if destination.is_file():
            destination.unlink()
    except (OSError, ValueError):
        pass
    return why
