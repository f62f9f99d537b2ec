"""Trajectories on disk: gzip-compressed JSON, read back under a cap.

A recording of the probe is a few MB of JSON; a file handed to ``compare`` is read chunk by
chunk and refused past ``MAX_TRAJECTORY_BYTES`` (a gzip bomb of 0.6 MB would otherwise become
1.7 GB in memory).
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

MAX_TRAJECTORY_BYTES = 256 * 2**20
_READ_CHUNK = 1 << 20


def save(trajectory: dict, path: str | Path) -> None:
    """The trajectory as gzip-compressed JSON (exact: every float keeps its repr)."""
    data = json.dumps(trajectory, allow_nan=True, separators=(",", ":")).encode()
    Path(path).write_bytes(gzip.compress(data, compresslevel=9, mtime=0))


def load(path: str | Path) -> dict:
    """A trajectory ``save`` wrote, or one written as plain JSON; ``TrajectoryTooLarge`` (a
    ``ValueError``, one line) when it holds more than ``MAX_TRAJECTORY_BYTES`` of JSON, which
    is found out while decompressing, chunk by chunk, never after (a small gzip file can
    expand a thousandfold)."""
    try:
        with Path(path).open("rb") as raw:
            compressed = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
            data = _read_capped(stream, path)
        return json.loads(data)
    except TrajectoryTooLarge:
        raise
    except (OSError, ValueError, EOFError, zlib.error, RecursionError) as error:
        raise ValueError(f"cannot read trajectory {path}: {error}") from None


class TrajectoryTooLarge(ValueError):
    """A trajectory file that holds (or decompresses to) more than the cap."""


def _read_capped(stream, path) -> bytes:
    chunks, total = [], 0
    while True:
        chunk = stream.read(_READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > MAX_TRAJECTORY_BYTES:
            raise TrajectoryTooLarge(
                f"trajectory {path} holds more than {MAX_TRAJECTORY_BYTES / 2**20:g} MB of JSON "
                f"(the cap, trajectory_file.MAX_TRAJECTORY_BYTES): refused")
        chunks.append(chunk)


