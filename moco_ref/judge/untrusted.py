"""Text a submission produced (its output, tracebacks, the messages built around them) made
safe to show: no terminal control or escape sequences, no bidirectional overrides, and
capped, so it can change neither the terminal nor the size of a report."""

from __future__ import annotations

import re

MAX_TEXT_CHARS = 64_000  # per field; the head and the tail are kept
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, screen clears
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[@-Z\\-_]?"  # two-character escapes, and a lone ESC
)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean_text(text: object, cap: int = MAX_TEXT_CHARS) -> str:
    """``text`` without escape sequences or control characters (newlines and tabs stay), at
    most ``cap`` characters: a longer text keeps its head and tail around a note of the cut."""
    text = str(text)
    text = _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text.replace("\r\n", "\n")))
    if len(text) <= cap:
        return text
    note = f"\n[… {len(text) - cap} characters cut by moco-ref …]\n"
    head = (cap - len(note)) // 2
    return text[:head] + note + text[len(text) - (cap - len(note) - head):]
