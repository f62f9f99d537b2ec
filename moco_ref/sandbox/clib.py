"""The C library the sandbox calls (``unshare``, ``mount``, ``prctl``, ``capset``, …) and one
way of turning a refused call into an ``OSError`` that says which."""

from __future__ import annotations

import ctypes
import functools
import os


@functools.cache
def c_library() -> ctypes.CDLL:
    """libc with ``errno`` kept, and ``prctl`` declared with its five arguments."""
    library = ctypes.CDLL(None, use_errno=True)
    library.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                              ctypes.c_ulong]
    return library


def check_call(result: int, what: str) -> None:
    """Raise ``OSError(errno, "what: reason")`` unless ``result`` is 0."""
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")
