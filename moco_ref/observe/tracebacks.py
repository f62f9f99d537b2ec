"""How a submission's failure is told: its own frames only, the failing line, and the shapes
and dtypes of the tensors in the frame that failed — so a student sees where and with what,
without a debugger and without the grader's own frames."""

from __future__ import annotations

import linecache
import re
import traceback
from pathlib import Path

import torch

OBSERVER_DIR = str(Path(__file__).resolve().parent)
HARNESS_DIR = str(Path(__file__).resolve().parents[1])  # every frame of the grader's package
TORCH_DIR = str(Path(torch.__file__).resolve().parent)
MAX_CHARS = 6000
MAX_TENSORS = 12


def submission_error_text(exc: BaseException) -> str:
    """The traceback from the submission's first frame on (the observer's frames above it are
    dropped), then the tensors of the innermost frame of the submission's own code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(OBSERVER_DIR):
        tb = tb.tb_next
    report = traceback.TracebackException(type(exc), exc, tb or exc.__traceback__)
    own = [frame for frame in report.stack if not _foreign(frame.filename)]
    if not own:  # raised by the observer or torch about what the submission gave: the words
        return "".join(report.format_exception_only())[-MAX_CHARS:]
    report.stack = traceback.StackSummary.from_list(own)  # torch's and the observer's frames
    text = "".join(report.format())  # say nothing the student can act on
    return (text + _failing_frame_tensors(tb))[-MAX_CHARS:]


def _foreign(filename: str) -> bool:
    return filename.startswith((HARNESS_DIR, TORCH_DIR, "<frozen"))


def _failing_frame_tensors(tb) -> str:
    frame = None
    while tb is not None:  # the innermost frame that is neither torch's nor the observer's
        if not _foreign(tb.tb_frame.f_code.co_filename):
            frame = tb.tb_frame
        tb = tb.tb_next
    if frame is None:
        return ""
    failing = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*",
                             linecache.getline(frame.f_code.co_filename, frame.f_lineno)))
    tensors = [(name, value) for name, value in list(frame.f_locals.items())
               if isinstance(value, torch.Tensor)]
    tensors.sort(key=lambda item: item[0] not in failing)  # the failing line's names first
    lines = [f"  {name}: {list(value.shape)} {str(value.dtype).replace('torch.', '')}"
             for name, value in tensors[:MAX_TENSORS]]
    if not lines:
        return ""
    return f"tensors in {frame.f_code.co_name} when it failed:\n" + "\n".join(lines) + "\n"
