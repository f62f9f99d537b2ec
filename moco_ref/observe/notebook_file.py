"""A notebook file's bytes as JSON text, and why bytes that are not a notebook are not.

Editors write notebooks with a UTF-8 byte-order mark (Windows tools), as UTF-16, with CRLF
line endings; all of them are read. A file that is truly not a notebook gets its cause named
in words a student can act on: empty, not JSON, cut short (truncated), invalid JSON at a line.
"""

from __future__ import annotations

import codecs
import json

from moco_ref.probe.styles import NotASubmission


def notebook_text(name: str, data: bytes) -> str:
    """A notebook file's JSON text: UTF-8, a UTF-8 byte-order mark dropped (Windows editors
    write one), UTF-16 or UTF-32 read by their byte-order mark."""
    for mark, encoding in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                           (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                           (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(mark):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError as exc:
                raise NotASubmission(f"{name} is not a readable notebook (it starts with a "
                                     f"{encoding} byte-order mark but is not {encoding}: "
                                     f"{exc.reason}); save it again as UTF-8") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotASubmission(f"{name} is not a readable notebook (not UTF-8: {exc.reason} at "
                             f"byte {exc.start}); save it again as UTF-8") from None


def unreadable_cause(data: bytes) -> str | None:
    """Why a notebook's bytes are not a notebook, in words a student can act on."""
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return "the file is empty"
    if text[0] not in "{[":
        return "it is not JSON: it does not start with '{'"
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        if _cut_short(text):
            return f"the JSON stops at character {len(text)} with brackets still open: truncated"
        return f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
    return None


def _cut_short(text: str) -> bool:
    """Whether JSON text ends inside a string or with a bracket still open (and none closed
    that was not opened): a file cut off while written or copied."""
    open_brackets, in_string, escaped = [], False, False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "{[":
            open_brackets.append("}" if char == "{" else "]")
        elif char in "}]":
            if not open_brackets or open_brackets.pop() != char:
                return False
    return in_string or bool(open_brackets)
