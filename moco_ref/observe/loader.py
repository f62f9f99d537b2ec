"""A submission into a namespace: its code run into a fresh module, with notes.

A submission is a ``.py`` file, a ``.ipynb`` notebook or an importable module path
(``pkg.module``; which of them the grader accepts is decided on its side, before any
loading). A notebook is read with nbformat: its code cells run in order, IPython magics and
shell lines are left out (they are not Python) — but a cell magic whose body IPython runs as
Python in the notebook's namespace (``%%time``, ``%%capture``, ``%%prun``) runs that body, and
``%%writefile`` writes its file, as IPython would (``ipython_syntax``) — and by default only its
definitions are
kept — imports, functions, classes and simple constants — so the training run, plots and
downloads a student leaves at top level do not run while grading. Every thing left out is
named in the notes, so a student can see why a name is missing.

This module runs inside the submission's process (see ``worker``); nothing here isolates.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import linecache
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from moco_ref.observe import platform_stubs
from moco_ref.observe.ipython_syntax import IPythonCalls, honoured_cell_magic, strip_ipython
from moco_ref.observe.notebook_file import notebook_text, unreadable_cause
from moco_ref.probe.source import is_module_target
from moco_ref.probe.styles import NotASubmission

SUBMISSION_MODULE_NAME = "moco_submission"  # not "__main__": `if __name__ == "__main__"` stays off


@dataclass
class LoadedSubmission:
    target: str
    kind: str  # "python file", "notebook" or "module"
    namespace: dict
    notes: list[str] = field(default_factory=list)
    # names a skipped top-level statement would have bound -> "cell N: `its first line` (line L)"
    skipped: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- loading


def load_submission(target: str, *, execute_all_cells: bool = False) -> LoadedSubmission:
    """Run the submission's code into a fresh module namespace and return it with notes.

    Exceptions raised by the submission's own code propagate unchanged: the caller turns
    them into a "not gradable" verdict with the traceback.
    """
    path = Path(target)
    platform_stubs.install().used.clear()
    if path.suffix == ".ipynb":
        return _with_stub_notes(_load_notebook(path, execute_all_cells=execute_all_cells))
    if path.suffix == ".py" or path.exists():
        return _with_stub_notes(_load_python_file(path))
    if is_module_target(target):
        module = importlib.import_module(target)
        origin = getattr(module, "__file__", None) or "a namespace package"
        return LoadedSubmission(
            target, "module", vars(module), [f"imported module {target} from {origin}"]
        )
    raise FileNotFoundError(f"no such file, notebook or importable module: {target}")


def _bind_platform_imports(tree: ast.Module, source: str, module) -> list[str]:
    """Take the unguarded top-level imports of a platform module the grader lacks
    (``platform_stubs.colab_bindings``) out of ``tree``, bind their names in ``module`` to
    stubs; returns their first lines."""
    kept, lines = [], []
    for node in tree.body:
        bound = platform_stubs.colab_bindings(node)
        if bound is None:
            kept.append(node)
            continue
        module.__dict__.update(bound)
        lines.append(_first_line(source, node))
    tree.body = kept
    return lines


def _with_stub_notes(loaded: LoadedSubmission) -> LoadedSubmission:
    """Say which platform modules (Colab's, the notebook bar) were stubbed while it loaded."""
    loaded.notes.extend(platform_stubs.used_notes())
    return loaded


def _fresh_module(file: Path | None) -> types.ModuleType:
    module = types.ModuleType(SUBMISSION_MODULE_NAME)
    if file is not None:
        module.__file__ = str(file)
    # Registered so that dataclasses, pickle and inspect find the module by name.
    sys.modules[SUBMISSION_MODULE_NAME] = module
    return module


def _load_python_file(path: Path) -> LoadedSubmission:
    source = _decoded(path)
    module = _fresh_module(path.resolve())
    tree = ast.parse(source, filename=str(path))
    notes = []
    calls = IPythonCalls()
    removed = calls.strip(tree)
    if removed:
        quoted = [f"`{line}`" for line in removed]
        notes.append(f"skipped IPython calls of a notebook export {_shown(quoted)}")
    if calls.ran:
        quoted = [f"`{line}`" for line in calls.ran]
        notes.append(f"ran the bodies of IPython cell magics as IPython does {_shown(quoted)}")
    stubbed = _bind_platform_imports(tree, source, module)
    if stubbed:
        notes.append(platform_stubs.colab_note("", stubbed))
    _remember_source(str(path), source)
    exec(compile(tree, str(path), "exec", dont_inherit=True), module.__dict__)
    return LoadedSubmission(str(path), "python file", module.__dict__, notes)


def _decoded(path: Path) -> str:
    """The file's text as Python itself would read it: a UTF-8 byte-order mark or a
    ``# -*- coding: … -*-`` line decides (PEP 263), UTF-8 otherwise."""
    data = path.read_bytes()
    try:
        source = importlib.util.decode_source(data)
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        reason = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise NotASubmission(f"{path.name} cannot be decoded as Python source: {reason} (save "
                             "it as UTF-8, or declare its encoding in a `# -*- coding: … -*-` "
                             "line)") from None
    if not source.strip():
        raise NotASubmission(f"{path.name} is empty: a lab submission defines train_moco and "
                             "moco_warmup, a builder submission a class MoCo")
    return source


def _load_notebook(path: Path, *, execute_all_cells: bool) -> LoadedSubmission:
    try:
        import nbformat
    except ImportError as exc:  # pragma: no cover - a dependency of moco-ref
        raise ImportError("grading notebooks needs nbformat: pip install nbformat") from exc

    data = path.read_bytes()
    try:
        notebook = nbformat.reads(notebook_text(path.name, data), as_version=4)
    except NotASubmission:
        raise
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook, unknown version
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        cause = unreadable_cause(data) or first
        raise NotASubmission(f"{path.name} is not a readable notebook ({cause}); open it in "
                             "Jupyter and save it again, or hand in a .py file") from None
    module = _fresh_module(None)
    notes: list[str] = []
    definitions = DefinitionFilter()
    skipped_names: dict[str, str] = {}
    code_cells = 0
    for number, cell in enumerate(notebook.cells, start=1):
        if cell.cell_type != "code":
            continue
        code_cells += 1
        source, magic_note, magic_names = honoured_cell_magic(cell.source, number)
        if magic_note:
            notes.append(magic_note)
            for name in magic_names:
                skipped_names.setdefault(name, f"cell {number}: {magic_note.split(': ', 1)[1]}")
        source, ipython_lines = strip_ipython(source)
        if ipython_lines:
            quoted = [f"`{line}`" for line in ipython_lines]
            notes.append(f"cell {number}: skipped IPython magic/shell {_shown(quoted)}")
        if not source.strip():
            continue
        filename = f"{path}#cell{number}"
        try:
            tree = ast.parse(source, filename=filename)  # a SyntaxError names the cell
        except SyntaxError as error:
            if execute_all_cells or _defines_something(source):
                raise
            notes.append(f"cell {number}: skipped, it does not parse ({error.msg}, line "
                         f"{error.lineno}) and defines no function or class")
            continue
        if not execute_all_cells:
            kept, skipped = definitions.split(tree.body)
            if skipped:
                first_lines = [_first_line(source, node) for node in skipped]
                notes.append(f"cell {number}: skipped top-level work {_shown(first_lines)}")
                for node, line in zip(skipped, first_lines, strict=True):
                    for name in _bound_names(node):
                        skipped_names.setdefault(name, f"cell {number}: {line}")
            tree.body = kept
            if not kept:
                continue
        stubbed = _bind_platform_imports(tree, source, module)
        if stubbed:
            notes.append(platform_stubs.colab_note(f"cell {number}: ", stubbed))
        _remember_source(filename, source)
        exec(compile(tree, filename, "exec", dont_inherit=True), module.__dict__)
    if execute_all_cells:
        notes.append(f"executed all {code_cells} code cells (--execute-all-cells)")
    return LoadedSubmission(str(path), "notebook", module.__dict__, notes,
                            dict(list(skipped_names.items())[:MAX_SKIPPED_NAMES]))


_DEFINITION_LINE = re.compile(r"^(async\s+def|def|class)\s", re.MULTILINE)


def _defines_something(source: str) -> bool:
    """Whether an unparsable cell starts a top-level ``def`` or ``class`` (a cell that would be
    kept, so its syntax error is the submission's to fix)."""
    return bool(_DEFINITION_LINE.search(source))


def _remember_source(filename: str, source: str) -> None:
    """Let tracebacks and ``inspect.getsource`` show a cell's lines."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def _first_line(source: str, node: ast.stmt, limit: int = 70) -> str:
    line = source.splitlines()[node.lineno - 1].strip()
    text = line if len(line) <= limit else line[: limit - 1] + "…"
    return f"`{text}` (line {node.lineno})"


def _shown(items: list[str], limit: int = 3) -> str:
    more = len(items) - limit
    return ", ".join(items[:limit]) + (f" and {more} more" if more > 0 else "")


# --------------------------------------------------------------------------- definitions only

_SAFE_CALLS = frozenset(
    {
        "torch.device",
        "torch.cuda.is_available",
        "torch.backends.mps.is_available",
        "torch.get_default_dtype",
        "dict",
        "list",
        "tuple",
        "set",
        "frozenset",
        "range",
        "float",
        "int",
        "str",
        "bool",
        "len",
        "min",
        "max",
        "abs",
        "round",
        "sorted",
        # values of imported libraries, computed from constants: no I/O, no training
        "torch.finfo",
        "torch.iinfo",
        "torch.tensor",
        "torch.as_tensor",
        "torch.zeros",
        "torch.ones",
        "torch.full",
        "torch.eye",
        "torch.arange",
        "torch.linspace",
        "torch.Generator",
        "numpy.finfo",
        "numpy.iinfo",
        "numpy.array",
        "numpy.asarray",
        "numpy.zeros",
        "numpy.ones",
        "numpy.full",
        "numpy.eye",
        "numpy.arange",
        "numpy.linspace",
        "numpy.sqrt",
        "numpy.log",
        "numpy.exp",
        "numpy.random.default_rng",
    }
)
_SAFE_MODULES = ("math.",)  # every function of these computes a value and nothing else
_BUILTIN_NAMES = frozenset(name for name in dir(builtins) if not name.startswith("__"))


class DefinitionFilter:
    """Decides, statement by statement, what a notebook cell defines (kept) and what it does
    (skipped). Kept: imports, ``def``/``class``, assignments of constant expressions
    (literals, arithmetic, names already kept, attributes such as ``torch.float32``, and a few
    side-effect-free calls such as ``torch.device('cpu')``), docstrings, and ``if``/``try``
    blocks made only of those. State carries across cells: names kept earlier count as known.
    """

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.aliases: dict[str, str] = {}  # local name -> dotted origin, from imports
        self.star_import = False

    def split(self, body: list[ast.stmt]) -> tuple[list[ast.stmt], list[ast.stmt]]:
        kept: list[ast.stmt] = []
        skipped: list[ast.stmt] = []
        for node in body:
            if self._keepable(node):
                self._bind(node)
                kept.append(node)
            else:
                skipped.append(node)
        return kept, skipped

    # -- statements

    def _keepable(self, node: ast.stmt) -> bool:
        if isinstance(
            node,
            ast.Import | ast.ImportFrom | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
        ):
            return True
        if isinstance(node, ast.Pass):
            return True
        if isinstance(node, ast.Expr):
            return isinstance(node.value, ast.Constant)  # a docstring or a bare literal
        if isinstance(node, ast.Assign):
            return all(_simple_target(t) for t in node.targets) and self.constant(node.value)
        if isinstance(node, ast.AnnAssign):
            return _simple_target(node.target) and (
                node.value is None or self.constant(node.value)
            )
        if isinstance(node, ast.AugAssign):
            return _simple_target(node.target) and self.constant(node.value)
        if isinstance(node, ast.If):
            return self.constant(node.test) and self._block(node.body + node.orelse)
        if isinstance(node, ast.Try):
            handlers = [stmt for handler in node.handlers for stmt in handler.body]
            return self._block(node.body + handlers + node.orelse + node.finalbody)
        return False

    def _block(self, body: list[ast.stmt]) -> bool:
        """A nested block is kept whole or not at all; names it binds count as known."""
        saved = (set(self.known), dict(self.aliases), self.star_import)
        for node in body:
            if not self._keepable(node):
                self.known, self.aliases, self.star_import = saved
                return False
            self._bind(node)
        self.known, self.aliases, self.star_import = saved
        return True

    def _bind(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                self.known.add(local)
                self.aliases[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    self.star_import = True
                    continue
                local = alias.asname or alias.name
                self.known.add(local)
                self.aliases[local] = f"{node.module or ''}.{alias.name}".lstrip(".")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.known.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self.known.update(_target_names(target))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            self.known.update(_target_names(node.target))
        elif isinstance(node, ast.If | ast.Try):
            nested = list(node.body) + list(node.orelse)
            if isinstance(node, ast.Try):
                nested += [stmt for handler in node.handlers for stmt in handler.body]
                nested += node.finalbody
            for stmt in nested:
                self._bind(stmt)

    # -- expressions

    def constant(self, node: ast.expr) -> bool:
        """Whether evaluating ``node`` is cheap and does no work beyond computing a value."""
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.known or node.id in _BUILTIN_NAMES or self.star_import
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return all(self.constant(element) for element in node.elts)
        if isinstance(node, ast.Dict):
            keys_ok = all(key is None or self.constant(key) for key in node.keys)
            return keys_ok and all(self.constant(value) for value in node.values)
        if isinstance(node, ast.Starred):
            return self.constant(node.value)
        if isinstance(node, ast.UnaryOp):
            return self.constant(node.operand)
        if isinstance(node, ast.BinOp):
            return self.constant(node.left) and self.constant(node.right)
        if isinstance(node, ast.BoolOp):
            return all(self.constant(value) for value in node.values)
        if isinstance(node, ast.Compare):
            return self.constant(node.left) and all(self.constant(c) for c in node.comparators)
        if isinstance(node, ast.IfExp):
            return all(self.constant(part) for part in (node.test, node.body, node.orelse))
        if isinstance(node, ast.Attribute):
            return self.constant(node.value)
        if isinstance(node, ast.Subscript):
            return self.constant(node.value) and self.constant(node.slice)
        if isinstance(node, ast.Slice):
            parts = (node.lower, node.upper, node.step)
            return all(part is None or self.constant(part) for part in parts)
        if isinstance(node, ast.JoinedStr):
            return all(self.constant(value) for value in node.values)
        if isinstance(node, ast.FormattedValue):
            return self.constant(node.value)
        if isinstance(node, ast.Lambda):
            return True  # defining a function does no work
        if isinstance(node, ast.Call):
            name = self._resolved_call_name(node.func) or ""
            return (
                (name in _SAFE_CALLS or name.startswith(_SAFE_MODULES))
                and all(self.constant(arg) for arg in node.args)
                and all(self.constant(keyword.value) for keyword in node.keywords)
            )
        return False

    def _resolved_call_name(self, func: ast.expr) -> str | None:
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return None
        head = self.aliases.get(func.id, func.id)
        return ".".join([head, *reversed(parts)])


MAX_SKIPPED_NAMES = 200


def _bound_names(node: ast.stmt) -> list[str]:
    """The names an assignment (or a ``for``/``with``) at the top of a cell binds."""
    if isinstance(node, ast.Assign):
        return [name for target in node.targets for name in _target_names(target)]
    if isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        return _target_names(node.target)
    if isinstance(node, ast.With | ast.AsyncWith):
        return [name for item in node.items if item.optional_vars is not None
                for name in _target_names(item.optional_vars)]
    return []


def _simple_target(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Tuple | ast.List):
        return all(_simple_target(element) for element in node.elts)
    if isinstance(node, ast.Starred):
        return _simple_target(node.value)
    return False


def _target_names(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return [name for element in node.elts for name in _target_names(element)]
    if isinstance(node, ast.Starred):
        return _target_names(node.value)
    return []
