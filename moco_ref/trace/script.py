"""Recording a user's own training script, unchanged: ``moco-ref trace record``.

The script runs in this process (trusted code) as ``python SCRIPT ARGS`` would run it, with its
seeds fixed. The recorder attaches to the first instance of the class named by ``--attach``
when it is first called, and reads the parts as attribute paths of that instance
(``encoder_q``, ``queue``, ``criterion.memory_bank.bank``, …); it stops the script once
``--steps`` training steps are recorded.
"""

from __future__ import annotations

import os
import random
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from moco_ref.trace.parts import MoCoParts
from moco_ref.trace.recorder import Recording, RecordingComplete


@dataclass
class PartPaths:
    """Where each part is, as attribute paths of the attached instance."""

    query: list[str]
    key: list[str]
    queue: str | None = None
    pointer: str | None = None
    layout: str = "dim-first"
    views: str | None = None  # a method of the instance (e.g. "forward", "training_step")
    temperature: float | None = None
    momentum: float | None = None

    def parts_of(self, instance) -> MoCoParts:
        def module(path: str) -> nn.Module:
            found = attribute(instance, path)
            if not isinstance(found, nn.Module):
                raise AttachError(f"{path} of {type(instance).__name__} is a "
                                  f"{type(found).__name__}, not an nn.Module")
            return found

        def reader(path: str | None):
            if path is None:
                return None
            attribute(instance, path)  # named wrong: said now, not at the first read
            return lambda: attribute(instance, path)

        views = None
        if self.views:
            views = instance if self.views == "forward" else (instance, self.views)
        return MoCoParts(
            query=tuple(module(p) for p in self.query), key=tuple(module(p) for p in self.key),
            queue=reader(self.queue), layout=self.layout, pointer=reader(self.pointer),
            temperature=self.temperature, momentum=self.momentum, views=views)


class AttachError(ValueError):
    """A part named by a path the attached instance does not have."""


def attribute(instance, path: str):
    found = instance
    for name in path.split("."):
        if isinstance(found, (nn.ModuleList, nn.Sequential)) and name.isdigit():
            found = found[int(name)]
            continue
        if not hasattr(found, name):
            raise AttachError(f"{type(instance).__name__} has no {path!r} (no {name!r} on "
                              f"{type(found).__name__})")
        found = getattr(found, name)
    return found


@dataclass
class ScriptRun:
    """A script's run under the recorder."""

    recording: Recording | None = None
    finished: str = ""  # "steps" (stopped after --steps), "end" (the script returned)
    error: BaseException | None = None
    notes: list[str] = field(default_factory=list)


def _forget_modules_under(folder: str, names: set[str]) -> None:
    """The script's own modules (from its folder) are imported afresh by the next recording
    (another revision's folder); a library's stay loaded."""
    root = os.path.realpath(folder).rstrip("/") + "/"
    for name in names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path and os.path.realpath(path).startswith(root):
            del sys.modules[name]


def fix_seeds(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def record_script(command: list[str], attach: str, paths: PartPaths, *, steps: int,
                  seed: int = 0, name: str | None = None) -> ScriptRun:
    """Run ``command`` (``[script.py, args…]`` or ``["-m", module, args…]``) and record the
    first instance of ``attach`` it calls."""
    run = ScriptRun()
    module_name, _, qualname = attach.rpartition(":") if ":" in attach else \
        attach.rpartition(".")
    stop = None

    def matches(cls: type) -> bool:
        return cls.__qualname__ == qualname and (not module_name or cls.__module__ in (
            module_name, "__main__") or cls.__module__.endswith("." + module_name))

    def attach_to(module: nn.Module, _args) -> None:
        nonlocal stop
        if run.recording is not None or not matches(type(module)):
            return
        parts = paths.parts_of(module)
        run.recording = Recording(parts, name or f"{attach} in {' '.join(command)}",
                                  steps=steps)
        stop = run.recording.start()

    from torch.nn.modules.module import register_module_forward_pre_hook

    handle = register_module_forward_pre_hook(attach_to)
    saved_argv, saved_path, saved_modules = sys.argv[:], sys.path[:], set(sys.modules)
    home = os.getcwd() if command[0] == "-m" else str(Path(command[0]).resolve().parent)
    fix_seeds(seed)
    try:
        if command[0] == "-m":
            sys.argv = [command[1], *command[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            script = Path(command[0]).resolve()
            sys.argv = [str(script), *command[1:]]
            sys.path.insert(0, str(script.parent))
            runpy.run_path(str(script), run_name="__main__")
        run.finished = "end"
    except RecordingComplete:
        run.finished = "steps"
    except SystemExit as exit_:
        run.finished = "end" if exit_.code in (None, 0) else ""
        if exit_.code not in (None, 0):
            run.error = exit_
    except Exception as error:  # noqa: BLE001 - the user's crash is part of the run
        run.error = error
    finally:
        handle.remove()
        if stop is not None:
            stop()
        sys.argv, sys.path[:] = saved_argv, saved_path
        _forget_modules_under(home, set(sys.modules) - saved_modules)
    if run.recording is not None and run.recording.cuda:
        run.notes.append("recorded on CUDA (moved to the CPU): torch.use_deterministic_"
                         "algorithms was on with warn_only, so a kernel with no deterministic "
                         "form may still differ between two runs beyond float rounding")
    return run
