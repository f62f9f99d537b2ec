"""The submission's side of grading, run in a process of its own by the runner:

    python -m moco_ref.grading.worker --target PATH --output FILE --options JSON

It loads the submission, settles its style, lets the harness observe it, and saves a record
(``torch.save``) holding only data — tensors, numbers, strings, lists, dicts — for the grader's
process to judge. Anything the submission raises, including ``SystemExit`` at import, becomes a
"not gradable" record with the traceback. Before observing it leaves a small progress file, so
the runner can tell a timeout while loading from a timeout while being observed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from moco_ref.conformance.options import GradeOptions
from moco_ref.grading.loader import SUBMISSION_MODULE_NAME, is_module_target, load_submission

RECORD_FORMAT = 1
PROGRESS_FILE_NAME = "progress.json"
_GRADER_DIR = str(Path(__file__).resolve().parent)


def observe_submission(
    target: str, options: GradeOptions, *, progress: Path | None = None
) -> dict:
    """Load, detect the style, observe. Never raises: failures become a not-gradable record."""
    timings: dict[str, float] = {}
    try:
        # Imported before any submission code runs, so a submission cannot stand in for them.
        from moco_ref.conformance.observe import observe
        from moco_ref.conformance.registry import detect_style
    except BaseException as exc:  # noqa: BLE001 - reported, never raised
        return _not_gradable("grader", options.style, [], _internal_error(exc), timings)

    stage, style, notes = "load", options.style, []
    try:
        started = time.perf_counter()
        loaded = load_submission(target, execute_all_cells=options.execute_all_cells)
        notes = loaded.notes
        timings["load"] = time.perf_counter() - started
        stage = "detect"
        if style is None:
            style = detect_style(loaded.namespace)
        stage = "observe"
        _write_progress(progress, stage, style, notes)
        started = time.perf_counter()
        observations = plain_data(observe(loaded.namespace, style, options))
        timings["observe"] = time.perf_counter() - started
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
        return _not_gradable(stage, style, notes, submission_traceback(exc), timings)
    return {
        "format": RECORD_FORMAT,
        "gradable": True,
        "stage": "observed",
        "style": style,
        "notes": notes,
        "observations": observations,
        "traceback": "",
        "timings": timings,
    }


def _not_gradable(stage: str, style, notes: list, trace: str, timings: dict) -> dict:
    return {
        "format": RECORD_FORMAT,
        "gradable": False,
        "stage": stage,
        "style": style,
        "notes": list(notes),
        "observations": {},
        "traceback": trace,
        "timings": timings,
    }


# --------------------------------------------------------------------------- data only


def plain_data(value, where: str = "observations"):
    """A copy of ``value`` made only of what ``torch.load(weights_only=True)`` accepts:
    plain tensors (detached, on the CPU, no subclass), numbers, strings, bools, None, lists,
    tuples and dicts. Anything else is a bug in the observer and raises ``TypeError``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if type(tensor) is not torch.Tensor:
            tensor = tensor.as_subclass(torch.Tensor)
        return tensor.clone()
    if isinstance(value, dict):
        return {
            plain_data(key, f"{where} key"): plain_data(item, f"{where}[{key!r}]")
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        items = [plain_data(item, f"{where}[{index}]") for index, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return plain_data(value.item(), where)
    if numpy is not None and isinstance(value, numpy.ndarray):
        return torch.from_numpy(numpy.array(value))
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}; observations "
        "must be tensors, numbers, strings, bools, None, lists, tuples or dicts"
    )


# --------------------------------------------------------------------------- tracebacks


def submission_traceback(exc: BaseException) -> str:
    """The traceback from the submission's point of view: the grader's own loading frames
    (this package and importlib's) are dropped from the top."""
    tb = exc.__traceback__
    while tb is not None and _is_loading_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is None and not isinstance(exc, SyntaxError):
        tb = exc.__traceback__  # nothing of the submission's: keep everything
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _is_loading_frame(filename: str) -> bool:
    return filename.startswith(_GRADER_DIR) or filename.startswith("<frozen ")


def _internal_error(exc: BaseException) -> str:
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"moco-ref internal error: the observing side could not be imported\n{trace}"


# --------------------------------------------------------------------------- files


def _write_progress(path: Path | None, stage: str, style, notes: list) -> None:
    if path is None:
        return
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"stage": stage, "style": style, "notes": notes}))
    os.replace(temporary, path)


def write_record(path: Path, record: dict) -> None:
    """Atomically: the runner never reads a half-written record."""
    temporary = path.with_name(path.name + ".tmp")
    torch.save(record, temporary)
    os.replace(temporary, path)


def _prepare_import_path(target: str, import_root: str | None) -> None:
    """A file's folder is importable (for its helper modules); a module path is imported as
    from the folder the grader was started in."""
    if is_module_target(target):
        if import_root:
            sys.path.insert(0, import_root)
    else:
        sys.path.insert(0, str(Path(target).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moco_ref.grading.worker")
    parser.add_argument("--target", required=True, help="a .py file, a .ipynb or a module path")
    parser.add_argument("--output", required=True, help="where to save the record")
    parser.add_argument("--options", default="{}", help="GradeOptions as JSON")
    parser.add_argument("--import-root", default=None, help="folder a module path imports from")
    args = parser.parse_args(argv)
    options = GradeOptions.from_dict(json.loads(args.options))
    output = Path(args.output)
    sys.argv = [SUBMISSION_MODULE_NAME]  # the submission does not see the grader's arguments
    torch.set_num_threads(1)  # same arithmetic whatever the parallelism of the grader
    _prepare_import_path(args.target, args.import_root)
    record = observe_submission(
        args.target, options, progress=output.with_name(PROGRESS_FILE_NAME)
    )
    try:
        write_record(output, record)
    except Exception as exc:  # noqa: BLE001 - e.g. observations that torch cannot save
        write_record(output, _not_gradable("save", record["style"], record["notes"],
                                           submission_traceback(exc), record["timings"]))
    return 0


if __name__ == "__main__":
    exit_code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the submission may have closed or replaced it
            pass
    # Straight out: threads or atexit hooks the submission left behind cannot hold us here.
    os._exit(exit_code)
