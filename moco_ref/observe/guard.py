"""Refusing ``import moco_ref`` from a submission (``--allow-reference-import`` turns it off).

A submission that imports the reference could hand its work to it (``MoCoTrainer`` does all
of MoCo) and be graded on the reference's behaviour. The worker installs this guard after it
has imported everything its observer needs and before the submission's code runs:

- ``builtins.__import__`` is wrapped: an ``import`` statement (or ``__import__`` call) that
  names ``moco_ref`` or one of its submodules — absolute, or relative from a package named so
  — is refused with an ``ImportError`` when the importing module is not part of ``moco_ref``;
- ``importlib.import_module`` is wrapped the same way (judged by its caller's module);
- a meta-path finder refuses to *find* ``moco_ref*`` modules for anyone else, which covers
  ``importlib.util.find_spec`` and the import system's own entry points.

Every refusal is remembered (``refused``) so the report can say so even when the submission
catches the ``ImportError`` and falls back to code of its own — which is then what is graded.

What it does NOT stop, by design of an in-process guard (the submission runs as ordinary
Python code in the same interpreter): reading already-imported modules out of
``sys.modules`` or through ``gc``, removing the guard, posing as a ``moco_ref`` module (a
forged ``__name__`` in its globals), or copying the reference's source. It stops the honest
mistake and the casual shortcut; a deliberate copy is a matter for plagiarism checks, and can
earn no more than a correct implementation would.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import sys

PROTECTED = "moco_ref"
ALLOW_FLAG = "--allow-reference-import"


class ReferenceImportRefused(ImportError):
    pass


def _protected(name: str | None) -> bool:
    return bool(name) and (name == PROTECTED or name.startswith(PROTECTED + "."))


def _importer_is_grader(module_globals) -> bool:
    if not isinstance(module_globals, dict):
        return False
    name = module_globals.get("__name__")
    spec = module_globals.get("__spec__")
    spec_name = getattr(spec, "name", None)
    return _protected(name) or _protected(spec_name)


def _absolute(name: str, module_globals, level: int) -> str:
    if level <= 0 or not isinstance(module_globals, dict):
        return name
    package = module_globals.get("__package__") or ""
    if not package:
        spec = module_globals.get("__spec__")
        package = getattr(spec, "parent", "") or ""
    parts = package.split(".") if package else []
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{name}" if name and base else (base or name)


def _caller_globals(depth: int):
    frame = sys._getframe(depth + 1)
    while frame is not None and frame.f_code.co_filename.startswith(("<frozen ", __file__)):
        frame = frame.f_back
    return frame.f_globals if frame is not None else {}


class ImportGuard:
    """Installed once per worker process (``install``); ``refused`` lists refused names."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self._original_import = builtins.__import__
        self._original_import_module = importlib.import_module
        self._finder = _RefusingFinder(self)

    def refuse(self, name: str) -> ReferenceImportRefused:
        if name not in self.refused:
            self.refused.append(name)
        return ReferenceImportRefused(
            f"moco-ref refuses to let a submission import its reference implementation "
            f"({name}): a graded submission must implement MoCo itself. Staff can allow it "
            f"with `moco-ref grade {ALLOW_FLAG}`.",
            name=name,
        )

    def install(self) -> ImportGuard:
        original_import = self._original_import
        original_import_module = self._original_import_module
        guard = self

        def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
            absolute = _absolute(name, globals, level)
            if _protected(absolute) and not _importer_is_grader(globals):
                raise guard.refuse(absolute)
            return original_import(name, globals, locals, fromlist, level)

        def guarded_import_module(name, package=None):
            absolute = importlib.util.resolve_name(name, package) if name.startswith(".") else name
            if _protected(absolute) and not _importer_is_grader(_caller_globals(1)):
                raise guard.refuse(absolute)
            return original_import_module(name, package)

        builtins.__import__ = guarded_import
        importlib.import_module = guarded_import_module
        sys.meta_path.insert(0, self._finder)
        return self


class _RefusingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, guard: ImportGuard) -> None:
        self.guard = guard

    def find_spec(self, fullname, path=None, target=None):
        if _protected(fullname) and not _importer_is_grader(_caller_globals(1)):
            raise self.guard.refuse(fullname)
        return None  # let the other finders do their work


def install() -> ImportGuard:
    import importlib.util  # noqa: F401 - resolve_name is used by the wrapper

    return ImportGuard().install()
