"""Capturing what a submission prints without letting it flood the grader: the first and the
last bytes are kept, the middle is counted and cut."""

from __future__ import annotations

import threading

DEFAULT_HEAD_BYTES = 10_000
DEFAULT_TAIL_BYTES = 10_000
_CHUNK = 65_536


class CappedOutput:
    """Keeps the head and the tail of a byte stream and how many bytes went between."""

    def __init__(self, head: int = DEFAULT_HEAD_BYTES, tail: int = DEFAULT_TAIL_BYTES) -> None:
        self.head_limit = head
        self.tail_limit = tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_limit > 0:
            self.tail += chunk
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if self.cut:
            return f"{head}\n[… {self.cut} bytes of output cut …]\n{tail}"
        return head + tail


class StreamDrain:
    """Reads a pipe to its end on a daemon thread into a ``CappedOutput``, so a child that
    writes a lot never blocks on a full pipe and never fills the grader's memory."""

    def __init__(self, pipe, output: CappedOutput | None = None) -> None:
        """``pipe`` is a binary buffered reader, as ``subprocess.Popen(stdout=PIPE)`` gives."""
        self.output = output or CappedOutput()
        self._pipe = pipe
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while chunk := self._pipe.read1(_CHUNK):
                self.output.feed(chunk)
        except (OSError, ValueError):
            pass  # the pipe was closed under us: keep what was read

    def finish(self, timeout: float = 5.0) -> str:
        """Wait (a bounded time) for the end of the stream and return the capped text."""
        self._thread.join(timeout)
        return self.output.text()
