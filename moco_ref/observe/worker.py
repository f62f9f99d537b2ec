"""The submission's side of grading, run in a process of its own (forked by the ``zygote``).

``run_job`` loads the submission, settles its style, lets the harness observe it part by
part (``parts``) and sends everything to the grader as frames on the observation channel
(``channel``): a ``STAGE`` frame once the submission is loaded, then for each part a
``PART_START`` frame and a ``PART`` frame holding only data — tensors, numbers, strings,
lists, dicts, within the wall's limits (``probe.wall.WALL.plain_copy``) — and a closing
``RESULT``. Anything the submission raises, including ``SystemExit`` and
``KeyboardInterrupt``, becomes data: at load time a "not gradable" result with the
traceback, during a part that part's failure.

Before the submission's code runs, everything the observer needs is already imported and
the reference-import guard (``guard``) is installed unless the options allow the import.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

import torch

# Imported here, before any submission code runs (the zygote preloads this module), so a
# submission cannot stand in for them and the reference-import guard need not let them in.
from moco_ref.observe import observers as _observe  # noqa: F401
from moco_ref.observe import parts as parts_module
from moco_ref.observe.channel import PART, PART_START, RESULT, STAGE, FrameWriter
from moco_ref.observe.loader import SUBMISSION_MODULE_NAME, load_submission
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import part_names
from moco_ref.probe.source import is_module_target
from moco_ref.probe.styles import NotASubmission
from moco_ref.probe.wall import WALL

RECORD_FORMAT = 2
_GRADER_DIR = str(Path(__file__).resolve().parent)


class _Collector:
    """A stand-in ``FrameWriter`` that keeps frames in memory (``observe_submission``)."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, object]] = []

    def send(self, kind: int, payload) -> None:
        self.frames.append((kind, payload))


def observe_streaming(target: str, options: GradeOptions, writer, *,
                      only_parts: list[str] | None = None, guard=None) -> None:
    """Load, detect the style, observe each part, sending frames to ``writer`` as it goes.
    Never raises: failures become frames."""
    # Imported before any submission code runs, so a submission cannot stand in for them.
    from moco_ref.probe.styles import detect_style

    timings: dict[str, float] = {}
    stage, style, notes = "load", options.style, []
    try:
        started = time.perf_counter()
        loaded = load_submission(target, execute_all_cells=options.execute_all_cells)
        notes = list(loaded.notes)
        timings["load"] = time.perf_counter() - started
        stage = "detect"
        if style is None:
            style = detect_style(loaded.namespace)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
        writer.send(RESULT, _result(False, stage, style, notes, submission_traceback(exc),
                                    timings, guard))
        return
    planned = part_names(style)
    todo = [name for name in planned if only_parts is None or name in only_parts]
    writer.send(STAGE, {"stage": "observe", "style": style, "notes": notes, "parts": planned,
                        "defined": parts_module.entry_points_defined(loaded.namespace, style),
                        "skipped": loaded.skipped})
    for name in todo:
        writer.send(PART_START, {"part": name})
        started = time.perf_counter()
        try:
            entry, rest = parts_module.observe_part(loaded.namespace, style, name, options)
            payload = {"part": name, "data": WALL.plain_copy(entry),
                       "meta": WALL.plain_copy(rest)}
        except BaseException as exc:  # noqa: BLE001 - the part's failure is data
            payload = {"part": name, "failed": submission_traceback(exc)[-8000:]}
        timings[name] = time.perf_counter() - started
        try:
            writer.send(PART, payload)
        except Exception as exc:  # noqa: BLE001 - e.g. observations torch cannot save
            writer.send(PART, {"part": name, "failed": "the observations could not be sent:\n"
                               + submission_traceback(exc)[-8000:]})
    writer.send(RESULT, _result(True, "observed", style, notes, "", timings, guard))


def _result(gradable: bool, stage: str, style, notes: list, trace: str, timings: dict,
            guard) -> dict:
    return {
        "format": RECORD_FORMAT,
        "gradable": gradable,
        "stage": stage,
        "style": style,
        "notes": [str(note) for note in notes],
        "traceback": trace,
        "timings": {key: float(value) for key, value in timings.items()},
        "refused_imports": list(getattr(guard, "refused", [])),
    }


def observe_submission(target: str, options: GradeOptions) -> dict:
    """In this process (no isolation, for debugging and tests): the frames ``run_job`` would
    send, as ``{"result", "stage", "parts": {name: payload}}``."""
    collector = _Collector()
    observe_streaming(target, options, collector)
    out: dict = {"parts": {}, "stage": None, "result": None}
    for kind, payload in collector.frames:
        if kind == STAGE:
            out["stage"] = payload
        elif kind == PART:
            out["parts"][payload["part"]] = payload
        elif kind == RESULT:
            out["result"] = payload
    return out


# --------------------------------------------------------------------------- tracebacks


def submission_traceback(exc: BaseException) -> str:
    """The traceback from the submission's point of view: the grader's own loading frames
    (this package and importlib's) are dropped from the top. A file that is no submission at
    all is said in one sentence."""
    if isinstance(exc, NotASubmission):
        return str(exc)
    tb = exc.__traceback__
    while tb is not None and _is_loading_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is None and not isinstance(exc, SyntaxError):
        tb = exc.__traceback__  # nothing of the submission's: keep everything
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _is_loading_frame(filename: str) -> bool:
    return filename.startswith(_GRADER_DIR) or filename.startswith("<frozen ")


# --------------------------------------------------------------------------- the job


def _prepare_import_path(target: str, import_root: str | None) -> None:
    """A file's folder is importable (for its helper modules); a module path is imported as
    from the folder the grader was started in."""
    if is_module_target(target):
        if import_root:
            sys.path.insert(0, import_root)
    else:
        sys.path.insert(0, str(Path(target).resolve().parent))


def run_job(request: dict, channel_fd: int) -> None:
    """Observe the submission the request names and exit the process (never returns).

    ``request``: ``target``, ``options`` (``GradeOptions.to_dict()``), ``import_root``,
    ``nonce`` (hex), ``parts`` (names to observe, or None for all).
    """
    writer = FrameWriter(channel_fd, bytes.fromhex(request["nonce"]))
    options = GradeOptions.from_dict(request["options"])
    sys.argv = [SUBMISSION_MODULE_NAME]  # the submission does not see the grader's arguments
    torch.set_num_threads(1)  # same arithmetic whatever the parallelism of the grader
    _prepare_import_path(request["target"], request.get("import_root"))
    guard = None
    if not options.allow_reference_import:
        from moco_ref.observe.guard import install

        guard = install()
    code = 0
    try:
        observe_streaming(request["target"], options, writer, only_parts=request.get("parts"),
                          guard=guard)
    except BaseException:  # noqa: BLE001 - e.g. the channel was closed under us
        code = 70
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the submission may have closed or replaced it
            pass
    # Straight out: threads or atexit hooks the submission left behind cannot hold us here.
    os._exit(code)
