"""Modules of the platform a notebook was written on, where the grader's process has none.

A Colab notebook imports ``google.colab`` (``drive.mount``, ``files.download``, ``output``); a
Jupyter one ``IPython.display`` or ``tqdm.notebook``. Nothing graded needs them, and the
loader skips top-level calls anyway, so the import alone must not make a notebook ungradable:

- an unguarded top-level ``import google.colab`` / ``from google.colab import drive`` (not
  inside a ``try``) is taken out of the code and its names bound to stubs
  (``colab_bindings``): calling anything in them raises ``PlatformOnly`` naming the call and
  why, so ``drive.mount`` inside ``train_moco`` fails with that reason, not with ``No module
  named 'google'``. A guarded import (``try: import google.colab`` … ``except ImportError``,
  the usual "am I on Colab?" test) is left alone: it still raises, and the notebook takes its
  own not-on-Colab branch;
- ``IPython.display``, when IPython is missing: ``display`` and ``clear_output`` do nothing and
  ``HTML``/``Markdown``/``Image`` hold their argument (showing output is not graded);
- ``tqdm.notebook`` and ``tqdm.auto``, when ipywidgets is missing (the widget bar would raise
  at its first use): the plain text bar, which writes to the captured stderr.

The finder is consulted after every real one (a real module always wins, except the widget
bar without its widgets). ``used_notes()`` says which stubs a submission imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

COLAB = "google.colab"
WHY = {
    COLAB: "Colab's own (Drive, uploads, Colab's output): the grader does not run on Colab",
    "IPython.display": "IPython's display (not installed where this is graded): it shows "
                       "nothing here",
    "tqdm.notebook": "the notebook progress bar without ipywidgets: the plain text bar is used",
}


class PlatformOnly(RuntimeError):
    """A call into a platform module the grader does not have."""


class _Refusing:
    """Any attribute of a Colab stub: calling it raises ``PlatformOnly``."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> _Refusing:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Refusing(f"{self._name}.{attribute}")

    def __call__(self, *args, **kwargs):
        raise PlatformOnly(f"{self._name}() is {WHY[COLAB]}; grading runs train_moco without "
                           "it (mount Drive or download files outside train_moco)")

    def __repr__(self) -> str:
        return f"<{self._name}: {WHY[COLAB]}>"


class _ColabModule(types.ModuleType):
    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Refusing(f"{self.__name__}.{attribute}")


class _Shown:
    """``HTML(...)``, ``Markdown(...)``, ``Image(...)`` without IPython: holds what it got."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs


def _nothing(*args, **kwargs) -> None:
    return None


def _display_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    if name == "IPython":
        module.__path__ = []
        module.get_ipython = lambda: None
    else:
        module.display = module.clear_output = module.update_display = _nothing
        for shown in ("HTML", "Markdown", "Image", "Javascript", "Latex", "SVG", "JSON",
                      "IFrame", "Math", "Pretty", "Code"):
            setattr(module, shown, type(shown, (_Shown,), {}))
    return module


def _plain_bar_module(name: str) -> types.ModuleType:
    from tqdm import std

    module = types.ModuleType(name)
    module.tqdm, module.trange = std.tqdm, std.trange
    module.tqdm_notebook, module.tnrange = std.tqdm, std.trange
    return module


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


class _Loader(importlib.abc.Loader):
    def __init__(self, build) -> None:
        self._build = build

    def create_module(self, spec):
        return self._build(spec.name)

    def exec_module(self, module) -> None:
        return None


class PlatformStubFinder(importlib.abc.MetaPathFinder):
    """Serves the stubs; placed last on ``sys.meta_path`` (the widget bar: first)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        build = self._builder(name)
        if build is None:
            return None
        package = name == "IPython"
        spec = importlib.machinery.ModuleSpec(name, _Loader(build), is_package=package)
        if package:
            spec.submodule_search_locations = []
        return spec

    def _builder(self, name: str):
        if name in ("IPython", "IPython.display") and _ipython_missing():
            self.used.add("IPython.display")
            return _display_module
        if name in ("tqdm.notebook", "tqdm.auto") and _widgets_missing():
            self.used.add("tqdm.notebook")
            return _plain_bar_module
        return None


_FINDER = PlatformStubFinder()
_MISSING: dict[str, bool] = {}


def _absent(name: str) -> bool:
    """Whether the real ``name`` cannot be imported (asked once; while it is being asked the
    stubs step aside, so the question is about the real module)."""
    if name not in _MISSING:
        _MISSING[name] = False
        _MISSING[name] = _missing(name)
    return _MISSING[name]


def _widgets_missing() -> bool:
    return _absent("ipywidgets")


def _ipython_missing() -> bool:
    return _absent("IPython")


class _WidgetBarFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: the widget bar's module exists but cannot draw a bar."""

    def find_spec(self, name, path=None, target=None):
        if name in ("tqdm.notebook", "tqdm.auto"):
            return _FINDER.find_spec(name, path, target)
        return None


def install() -> PlatformStubFinder:
    """Put the finders on ``sys.meta_path`` (once) and return the one that records use."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
        sys.meta_path.insert(0, _WidgetBarFinder())
    return _FINDER


def used_notes() -> list[str]:
    """One note per platform stub the submission imported."""
    return [f"{name} is {WHY[name]}: stubbed" for name in sorted(_FINDER.used)]


def colab_bindings(node) -> dict[str, object] | None:
    """For a top-level ``import google.colab[...]`` or ``from google.colab[...] import …``
    where the real module is missing: the names it would bind, as stubs; else None."""
    import ast

    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
            node.module == COLAB or node.module.startswith(COLAB + ".")):
        if not _absent(COLAB):
            return None
        return {alias.asname or alias.name: _Refusing(f"{node.module}.{alias.name}")
                for alias in node.names if alias.name != "*"}
    if isinstance(node, ast.Import) and any(alias.name == COLAB or alias.name.startswith(
            COLAB + ".") for alias in node.names):
        if not _absent(COLAB) or len(node.names) != 1:
            return None
        alias = node.names[0]
        if alias.asname:
            return {alias.asname: _colab_module(alias.name)}
        google = _colab_module("google")
        google.colab = _colab_module(COLAB)
        return {"google": google}
    return None


def _colab_module(name: str) -> types.ModuleType:
    module = _ColabModule(name)
    module.__path__ = []
    return module


def colab_note(where: str, lines: list[str]) -> str:
    shown = ", ".join(f"`{line}`" for line in lines)
    return (f"{where}{shown}: google.colab is {WHY[COLAB]}: stubbed (calling it raises; the "
            "import was not run)")


# what a submission can see of a stub: google.colab's names, not the grader's
for _stub in (_Refusing, _ColabModule):
    _stub.__module__ = COLAB
