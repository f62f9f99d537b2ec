"""Gradescope's ``submission_metadata.yml``: who handed in each submission folder of an
export (a group lists several submitters) and whether they were late, read without trusting
it for anything but names, ids and lateness (``intake``)."""

from __future__ import annotations

import re
from pathlib import Path

from moco_ref.run.targets import Student


def gradescope_metadata(path: Path) -> dict[str, dict]:
    """``{folder: {"sid", "name", "students"}}`` from Gradescope's export (keys written as
    Ruby symbols, ``:submitters:``; several submitters for a group); empty when there is none
    or it cannot be read. A student is late when the entry says so (``:late:``), or when its
    ``:created_at:`` is after a due date the metadata carries (``:due_date:`` of the entry,
    of its ``:assignment:``, or of a top-level ``:assignment:``); unknown otherwise."""
    if not path.is_file():
        return {}
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except Exception:  # noqa: BLE001 - the grades do not depend on it
        return {}
    found = {}
    if not isinstance(data, dict):
        return found
    due = _due_date(data)
    for folder, entry in data.items():
        if not isinstance(entry, dict):
            continue
        submitters = _field(entry, "submitters") or []
        people = [s for s in submitters if isinstance(s, dict)] if isinstance(
            submitters, list) else []
        if people:
            late = _lateness(entry, _due_date(entry) or due)
            students = tuple(Student(str(_field(p, "sid") or ""), str(_field(p, "name") or ""),
                                     late, "gradescope") for p in people)
            found[str(folder)] = {
                "sid": ";".join(student.id for student in students),
                "name": ";".join(student.name for student in students),
                "students": students,
            }
    return found


def _field(entry: dict, key: str):
    """``entry[":key"]`` (Gradescope writes Ruby symbols) or ``entry["key"]``."""
    value = entry.get(f":{key}")
    return entry.get(key) if value is None else value


def _due_date(entry: dict):
    """The due date an entry of the metadata carries, itself or in its ``assignment``."""
    assignment = _field(entry, "assignment")
    due = _field(entry, "due_date")
    if due is None and isinstance(assignment, dict):
        due = _field(assignment, "due_date")
    return _moment(due)


def _lateness(entry: dict, due) -> bool | None:
    said = _field(entry, "late")
    if isinstance(said, bool):
        return said
    created = _moment(_field(entry, "created_at"))
    if created is None or due is None:
        return None
    try:
        return created > due
    except TypeError:  # one with a time zone, one without: not comparable
        return None


def _moment(value):
    """A time of the metadata as a ``datetime`` (YAML reads most as one already)."""
    import datetime

    if isinstance(value, datetime.datetime):
        return value
    if isinstance(value, str):
        text = re.sub(r"(\.\d{6})\d+", r"\1", value.strip())  # Ruby writes nanoseconds
        text = re.sub(r"\s+([+-]\d\d:?\d\d)$", r"\1", text)
        try:
            return datetime.datetime.fromisoformat(text)
        except ValueError:
            return None
    return None
