"""What names a submission (a ``.py`` file, a ``.ipynb`` notebook, or a module path), and
which entry points a submission file binds, read from its source without running it.

Both sides of the sandbox use the first: the grader to choose what to grade, the worker to
know how to load it.

One rule, used wherever a file's entry points matter (which file of a student's folder is
graded, which siblings may be its helper modules, which style a file is): a name counts when
the module binds it at top level — ``def``, ``class``, an assignment (``train_moco = _impl``),
an annotated assignment, or an import (``from impl import train_moco``,
``import impl as MoCo``). A file that does not parse binds nothing as far as this goes; it is
judged when it is graded.
"""

from __future__ import annotations

import ast
import functools
import re
import threading
from pathlib import Path

from moco_ref.probe.styles import (
    ENTRY_POINTS,
    MOCO_METHODS,
    OBSERVED_STYLES,
    as_entry_points,
    style_of_names,
)

SUBMISSION_SUFFIXES = (".py", ".ipynb")
MAX_SOURCE_BYTES = 8 * 2**20  # a larger file is not read here (it is refused when graded)
_AST_LOCK = threading.Lock()  # CPython 3.11's ast constructor is not safe across threads
_MODULE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def is_module_target(target: str) -> bool:
    """A dotted name that is not an existing path and has no submission suffix."""
    return (
        bool(_MODULE_PATH.match(target))
        and not target.endswith(SUBMISSION_SUFFIXES)
        and not Path(target).exists()
    )


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _target_names(element)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return []


def top_level_bindings(tree: ast.Module) -> set[str]:
    """Every name the module's top-level statements bind (not those inside functions, and
    not those of ``if``/``try`` blocks, which may not run)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(name for target in node.targets for name in _target_names(target))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            names.update(_target_names(node.target))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def _parse(source: str | bytes) -> ast.Module:
    with _AST_LOCK:
        return ast.parse(source)


def _cell_trees(source: str) -> list[ast.Module]:
    """A notebook's code cells as parsed modules: a cell with IPython lines (``%…``, ``!…``)
    is parsed without them; one that still does not parse is left out."""
    try:
        return [_parse(source)]
    except (SyntaxError, ValueError, RecursionError):
        pass
    kept = [line for line in source.splitlines()
            if not line.lstrip().startswith(("%", "!"))]
    try:
        return [_parse("\n".join(kept))]
    except (SyntaxError, ValueError, RecursionError):
        return []


def module_trees(path: Path) -> tuple[ast.Module, ...] | None:
    """The parsed top level of a ``.py`` file, or of each code cell of a ``.ipynb``; None
    when the file cannot be read or parsed at all. Parsed once per version of the file
    (``_file_version``): choosing helpers in a flat class folder asks about every sibling
    of every submission. The trees are shared: read them, never change them."""
    version = _file_version(Path(path))
    return None if version is None else _trees_of(str(path), version)


def _file_version(path: Path) -> tuple[int, ...] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=2048)
def _trees_of(path: str, version: tuple[int, ...]) -> tuple[ast.Module, ...] | None:
    try:
        if version[2] > MAX_SOURCE_BYTES:
            return None
        if path.endswith(".ipynb"):
            import nbformat

            notebook = nbformat.read(path, as_version=4)
            return tuple(tree for cell in notebook.cells if cell.cell_type == "code"
                         for tree in _cell_trees(cell.source))
        return (_parse(Path(path).read_bytes()),)
    except Exception:  # noqa: BLE001 - an unreadable file binds nothing here
        return None


def top_level_names(path: Path) -> set[str]:
    """Every name ``path`` binds at top level (a notebook: over its cells), unrun."""
    names: set[str] = set()
    for tree in module_trees(Path(path)) or ():
        names |= top_level_bindings(tree)
    return names


def moco_marks(node: ast.ClassDef) -> list[str]:
    """What in a class's body makes it a MoCo module: its official methods, a ``queue``
    buffer, a pair of encoders, a ``forward`` over two views (``[]`` when none)."""
    from moco_ref.probe.builder import ENCODER_NAMES

    methods = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
    marks = sorted(MOCO_METHODS & set(methods))
    assigned = {target.attr for item in ast.walk(node) if isinstance(item, ast.Assign)
                for target in item.targets if isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name) and target.value.id == "self"}
    buffers = {item.args[0].value for item in ast.walk(node) if isinstance(item, ast.Call)
               and isinstance(item.func, ast.Attribute) and item.func.attr == "register_buffer"
               and item.args and isinstance(item.args[0], ast.Constant)}
    if "queue" in buffers or "queue" in assigned:
        marks.append("a queue")
    pair = next(((q, k) for q, k in ENCODER_NAMES if {q, k} <= assigned), None)
    if pair:
        marks.append(f"encoders {pair[0]} and {pair[1]}")
    forward = methods.get("forward")
    if forward is not None and len(forward.args.args) >= 3:
        marks.append("forward over two views")
    return marks


def moco_like_class(path: Path) -> tuple[str, list[str]] | None:
    """``(name, marks)`` of the one top-level class of ``path`` that is a MoCo module by what
    it holds (at least three ``moco_marks``, two encoders among them), when it binds no entry
    point of any style; None otherwise (none, or more than one such class)."""
    trees = module_trees(Path(path)) or ()
    found = [(node.name, marks) for tree in trees for node in tree.body
             if isinstance(node, ast.ClassDef)
             for marks in [moco_marks(node)]
             if len(marks) >= 3 and any(mark.startswith("encoders") for mark in marks)]
    return found[0] if len(found) == 1 else None


def loop_name_rebindings(path: Path) -> list[tuple[int, str]]:
    """``(line, the line's text)`` of each statement in ``path`` that rebinds a ``for``
    loop's own name to arithmetic on it (``for p_k, p_q in zip(…): p_k = m * p_k + …``): an
    update that makes a new tensor and leaves the one the loop visits unchanged (the first
    ``MAX_REBINDINGS``; a notebook's lines are counted per cell)."""
    found: list[tuple[int, str]] = []
    for tree in module_trees(Path(path)) or ():
        for loop in ast.walk(tree):
            if not isinstance(loop, ast.For):
                continue
            names = {node.id for node in ast.walk(loop.target) if isinstance(node, ast.Name)}
            for statement in (n for item in loop.body for n in ast.walk(item)):
                if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and \
                        isinstance(statement.targets[0], ast.Name) and \
                        statement.targets[0].id in names and \
                        isinstance(statement.value, ast.BinOp) and \
                        statement.targets[0].id in {n.id for n in ast.walk(statement.value)
                                                    if isinstance(n, ast.Name)}:
                    found.append((statement.lineno, ast.unparse(statement)[:160]))
    return sorted(found)[:MAX_REBINDINGS]


MAX_REBINDINGS = 3
CAPACITY_NAMES = frozenset({"capacity", "queue_size", "queue_len", "queue_length",
                            "max_queue", "queue_capacity", "dict_size", "memory_size"})


def stated_capacity(path: Path) -> tuple[int, int] | None:
    """``(capacity, line)`` when ``path`` (its top level, ``train_moco`` or any other function
    of it) binds queue-capacity names (``CAPACITY_NAMES`` in any case, or ``K``) to one integer
    constant, alone or in a tuple assignment (``m, capacity = 0.95, 240``): the first such line;
    None when it binds none, or several values. What the student meant the queue to hold, for
    a queue that never dropped an entry: evidence for the message, read without running
    anything."""
    found: set[tuple[int, int]] = set()
    for tree in module_trees(Path(path)) or ():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                found |= _capacity_bindings(node.targets[0], node.value, node.lineno)
    values = {value for value, _ in found}
    if len(values) != 1:
        return None
    return min(found, key=lambda item: item[1])


def _capacity_bindings(target, value, line: int) -> set[tuple[int, int]]:
    pairs = [(target, value)]
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and \
            len(target.elts) == len(value.elts):
        pairs = list(zip(target.elts, value.elts))
    return {(item.value, line) for name, item in pairs
            if isinstance(name, ast.Name)
            and (name.id.casefold() in CAPACITY_NAMES or name.id == "K")  # k: a key tensor
            and isinstance(item, ast.Constant) and type(item.value) is int and item.value > 0}


def bound_entry_points(path: Path) -> set[str]:
    """The MoCo entry-point names ``path`` binds at top level, read without running it (a
    builder class named ``MoCo`` in another case counts as ``MoCo``)."""
    return as_entry_points(top_level_names(path))


# a shared module may provide the warm-up (LAB 07's is often factored out): binding only
# moco_warmup does not make a file a submission of its own
HELPER_MAY_BIND = frozenset({"moco_warmup"})


def may_be_helper(path: Path) -> bool:
    """A ``.py`` file another file of the same student may import: it parses and binds no
    entry point but the warm-up (a file that binds one is graded on its own, or is a
    classmate's)."""
    trees = module_trees(Path(path))
    submission_names = set(ENTRY_POINTS) - HELPER_MAY_BIND
    return trees is not None and not any(as_entry_points(top_level_bindings(tree))
                                         & submission_names for tree in trees)


def imported_modules(path: Path) -> frozenset[str]:
    """The top-level names of the modules ``path`` imports anywhere (absolute imports; a
    notebook: over its cells), read without running it."""
    version = _file_version(Path(path))
    return frozenset() if version is None else _imports_of(str(path), version)


@functools.lru_cache(maxsize=2048)
def _imports_of(path: str, version: tuple[int, ...]) -> frozenset[str]:
    names: set[str] = set()
    for tree in _trees_of(path, version) or ():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return frozenset(names)


def imported_helper(helper: Path, main: Path) -> bool:
    """Whether the ``.py`` file ``helper`` beside ``main`` is ``main``'s helper module because
    ``main`` imports it, whatever names it defines (a student's ``KeyQueue`` in
    ``moco_utils.py``) — unless it binds an entry point of ``main``'s own style, the warm-up
    included (then it is that style's code in its own right: in a class folder a
    classmate's, never a helper)."""
    if helper.suffix != ".py" or helper.stem not in imported_modules(main):
        return False
    style = style_from_source(main)
    own = set(OBSERVED_STYLES[style].entry_points) if style else set(ENTRY_POINTS)
    return module_trees(helper) is not None and not bound_entry_points(helper) & own


def style_from_source(path: Path) -> str | None:
    """The style the entry points ``path`` binds point to (``style_of_names``), or None."""
    return style_of_names(bound_entry_points(path))


def styles_of(names) -> list[str]:
    """Every style whose own entry points are among ``names`` (more than one: an ambiguous
    file)."""
    return [style.name for style in OBSERVED_STYLES.values()
            if set(names) & set(style.entry_points)]


def module_file(name: str) -> Path | None:
    """The source file of the dotted module ``name``, found as Python would find it from the
    current folder and ``sys.path`` — without importing anything (no package ``__init__``
    runs)."""
    import importlib.machinery
    import os
    import sys

    head, *rest = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(head, [os.getcwd(), *sys.path])
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.has_location else None
    folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    for part in rest[:-1]:
        folders = [folder / part for folder in folders if (folder / part).is_dir()]
    for folder in folders:
        for candidate in (folder / f"{rest[-1]}.py", folder / rest[-1] / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None
