"""A run's output folder: where it is unless told, and how a file gets into it — written
whole or not at all (a reader, another shard or an interrupted run never sees half a file)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_OUT = "grading-reports"


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` (its folder made), through a temporary file renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
