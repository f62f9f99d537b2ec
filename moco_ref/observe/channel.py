"""The one-way channel from a submission's process to the grader: framed messages on a pipe.

The pipe is created by the grader and its write end is handed to the worker process as an
inherited file descriptor (close-on-exec, so programs the submission execs do not get it). It
has no name in the file system: nothing the submission writes to a file — in its working
directory, a parent folder or ``/tmp`` — can be taken for an observation.

A frame is ``MAGIC | nonce (16 bytes) | kind (1 byte) | length (8 bytes, big-endian) |
payload``. The nonce is drawn per run by the grader; a frame without it ends the channel as
*corrupt*. What the nonce does NOT do: keep a determined submission from forging frames — it
runs in the same process as the observer and can read the nonce from memory. Integrity of
the *observations* rests instead on the grader's side: every record is validated against the
probe the grader asked for (``record``) and judged by recomputation (``judge``), so a forged
record must be as consistent as a real run of a correct MoCo to earn anything. The nonce and
the framing only catch accidents and naive interference (stray bytes from a forked child, a
submission writing to every descriptor it finds).
"""

from __future__ import annotations

import io
import json
import os
import select
import struct
import threading
import time
import zipfile
from dataclasses import dataclass, field

import torch

MAGIC = b"MRF1"
NONCE_BYTES = 16
_HEADER = struct.Struct(f">4s{NONCE_BYTES}sBQ")
MAX_CHANNEL_BYTES = 512 * 2**20  # all frames of one run; beyond it the channel is corrupt
MAX_FRAME_BYTES = 384 * 2**20

# kinds
STAGE = 1  # json: {"stage", "style", "notes", "parts", "defined"}
PART_START = 2  # json: {"part"}
PART = 3  # torch: {"part", "data", "meta"} (meta: the record's other entries) or {"part", "failed"}
RESULT = 5  # json: {"gradable", "stage", "style", "notes", "traceback", "timings", …}
EXIT = 6  # json, from the supervisor: {"status", "isolation", "swept"}

KIND_NAMES = {STAGE: "stage", PART_START: "part-start", PART: "part", RESULT: "result",
              EXIT: "exit"}
_JSON_KINDS = {STAGE, PART_START, RESULT, EXIT}


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


# --------------------------------------------------------------------------- writing


class FrameWriter:
    """Writes frames to a file descriptor (the worker's side)."""

    def __init__(self, fd: int, nonce: bytes) -> None:
        self.fd = fd
        self.nonce = nonce

    def send(self, kind: int, payload) -> None:
        if kind in _JSON_KINDS:
            body = json.dumps(payload).encode()
        else:
            buffer = io.BytesIO()
            torch.save(payload, buffer)
            body = buffer.getvalue()
        data = _HEADER.pack(MAGIC, self.nonce, kind, len(body)) + body
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]


# --------------------------------------------------------------------------- reading


@dataclass
class Frame:
    kind: int
    payload: object
    at: float  # time.monotonic() when it was read


@dataclass
class ChannelLog:
    frames: list[Frame] = field(default_factory=list)
    corrupt: str = ""  # why the channel was cut, if it was
    total_bytes: int = 0
    closed: bool = False


class FrameReader:
    """Reads frames from the read end of the pipe on a daemon thread (the grader's side).

    Frames are decoded as they arrive (``torch.load(weights_only=True)``: plain data only).
    Anything malformed — a wrong magic or nonce, an unknown kind, an oversized frame, a payload
    that does not decode — marks the channel corrupt; the rest of the stream is drained and
    dropped so the writer never blocks. ``on_frame(frame)`` is called for each good frame, and
    ``on_frame(None)`` once at the end. ``stop()`` ends reading even if some writer (a process
    that escaped the sweep) still holds the pipe open.
    """

    def __init__(self, fd: int, nonce: bytes, on_frame=None) -> None:
        self.nonce = nonce
        self.log = ChannelLog()
        self._fd = fd
        self._on_frame = on_frame
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._buffer = bytearray()
        self._thread = threading.Thread(target=self._run, daemon=True, name="moco-ref-channel")
        self._thread.start()

    def frames(self) -> list[Frame]:
        with self._lock:
            return list(self.log.frames)

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> ChannelLog:
        self._thread.join(timeout)
        return self.log

    def _chunks(self):
        """Bytes as they arrive, until end of file or ``stop()``."""
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.1)
            if not ready:
                continue
            chunk = os.read(self._fd, 1 << 20)
            if not chunk:
                return
            yield chunk

    def _run(self) -> None:
        corrupt = ""
        try:
            for chunk in self._chunks():
                if corrupt:
                    continue  # drained and dropped
                self.log.total_bytes += len(chunk)
                try:
                    if self.log.total_bytes > MAX_CHANNEL_BYTES:
                        raise _Corrupt(f"more than {MAX_CHANNEL_BYTES} bytes of observations")
                    self._buffer += chunk
                    self._parse()
                except _Corrupt as exc:
                    corrupt = str(exc)
                    self._buffer = bytearray()
            if self._buffer and not corrupt:
                corrupt = "a frame cut short"
        except OSError:
            pass
        finally:
            self.log.corrupt = corrupt
            self.log.closed = True
            try:
                os.close(self._fd)
            except OSError:
                pass
            if self._on_frame is not None:
                self._on_frame(None)

    def _parse(self) -> None:
        while len(self._buffer) >= _HEADER.size:
            magic, nonce, kind, length = _HEADER.unpack_from(self._buffer)
            if magic != MAGIC or nonce != self.nonce:
                raise _Corrupt("a frame without the run's magic and nonce")
            if kind not in KIND_NAMES:
                raise _Corrupt(f"a frame of unknown kind {kind}")
            if length > MAX_FRAME_BYTES:
                raise _Corrupt(f"a frame of {length} bytes")
            end = _HEADER.size + length
            if len(self._buffer) < end:
                return
            body = bytes(self._buffer[_HEADER.size:end])
            del self._buffer[:end]
            frame = Frame(kind, _decode(kind, body), time.monotonic())
            with self._lock:
                self.log.frames.append(frame)
            if self._on_frame is not None:
                self._on_frame(frame)


class _Corrupt(Exception):
    pass


def _refuse_compressed(body: bytes) -> None:
    """``torch.save`` stores its members uncompressed; a frame whose archive inflates (a
    decompression bomb) or claims more than it carries is refused before it is read."""
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        members = archive.infolist()
        if any(m.compress_type != zipfile.ZIP_STORED or m.file_size != m.compress_size
               for m in members) or sum(m.file_size for m in members) > len(body):
            raise ValueError("its archive has compressed members")


def _decode(kind: int, body: bytes):
    try:
        if kind in _JSON_KINDS:
            value = json.loads(body.decode("utf-8"))
            if not isinstance(value, dict):
                raise ValueError("not an object")
            return value
        _refuse_compressed(body)
        return torch.load(io.BytesIO(body), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - anything that is not plain data is refused
        raise _Corrupt(f"a {KIND_NAMES[kind]} frame that is not plain data: {exc}") from None
