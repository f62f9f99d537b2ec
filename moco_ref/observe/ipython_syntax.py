"""IPython's syntax in a submission: what a notebook's cell or its ``.py`` export holds that is
not Python, and what IPython would make of it.

- ``strip_ipython``: ``%line`` magics, ``!shell`` lines, ``x = !cmd`` and ``name?`` help
  lines of a cell become ``pass`` (blocks and line numbers kept);
- ``cell_magic`` / ``honoured_cell_magic``: a cell that starts with ``%%name`` — the body of
  ``%%time``, ``%%capture`` and ``%%prun`` (``BODY_RUN_MAGICS``) is run, as IPython runs it in
  the notebook's namespace; ``%%writefile NAME`` writes its file into the working directory;
  ``%%timeit`` keeps nothing it defines; any other cell magic is not Python and not run;
- ``IPythonCalls``: the ``get_ipython()`` calls of a notebook exported as ``.py`` become
  ``pass``, a ``run_cell_magic`` of ``BODY_RUN_MAGICS`` its body.

This module runs inside the submission's process (``loader``); nothing here isolates.
"""

from __future__ import annotations

import ast
import re
import sys

from moco_ref.probe.source import top_level_bindings

# cell magics whose body IPython runs as Python in the notebook's own namespace
BODY_RUN_MAGICS = frozenset({"time", "capture", "prun"})
MAX_WRITTEN_FILE = 1 << 20


def cell_magic(source: str) -> tuple[str, str, str] | None:
    """``(name, arguments, body)`` of a cell that starts with a ``%%name arguments`` line,
    else None; the body keeps its line numbers (the magic's line becomes blank)."""
    lines = source.splitlines()
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        stripped = line.strip()
        if not stripped.startswith("%%"):
            return None
        name, _, arguments = stripped[2:].partition(" ")
        body = "\n" * (index + 1) + "\n".join(lines[index + 1:])
        return name, arguments.strip(), body
    return None


def honoured_cell_magic(source: str, number: int) -> tuple[str, str, list[str]]:
    """The Python to run for a cell, with IPython's meaning of its cell magic: the body of a
    ``BODY_RUN_MAGICS`` cell; nothing for ``%%writefile`` (its file is written, into the
    working directory only) and for any other cell magic (``%%timeit`` keeps nothing it
    defines; ``%%bash``, ``%%html`` … are not Python). Returns the source, the note for the
    report (empty for a cell without a cell magic) and the names a cell left unrun would
    have defined (so that a later ``NameError`` points at it)."""
    found = cell_magic(source)
    if found is None:
        return source, "", []
    name, arguments, body = found
    shown = f"`%%{name}{' ' + arguments if arguments else ''}`"[:80]
    if name in BODY_RUN_MAGICS:
        return body, f"cell {number}: ran the body of {shown} as IPython does", []
    if name == "writefile":
        return "", f"cell {number}: {shown} {_write_cell_file(arguments, body)}", []
    why = ("runs its body in a namespace of its own, so IPython keeps nothing it defines"
           if name == "timeit" else "is not Python, so the cell was not run")
    return "", f"cell {number}: {shown} {why}", _names_in(body)


def _write_cell_file(arguments: str, body: str) -> str:
    """``%%writefile [-a] NAME``: the body into NAME, a plain file name in the working
    directory; what was done, in words."""
    parts = arguments.split()
    append = bool(parts) and parts[0] in ("-a", "--append")
    name = parts[-1] if parts else ""
    if not name or "/" in name or name.startswith(".") or len(parts) > 2:
        return "was not honoured (only a plain file name in the working directory is)"
    text = body.lstrip("\n") + "\n"
    if len(text.encode()) > MAX_WRITTEN_FILE:
        return f"was not honoured (more than {MAX_WRITTEN_FILE} bytes)"
    try:
        with open(name, "a" if append else "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as error:
        return f"could not write {name} ({error.strerror})"
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, ".")  # IPython's working directory is importable
    return f"wrote {name}, as IPython does"


def _names_in(body: str) -> list[str]:
    """The top-level names a body would bind, when it parses as Python."""
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return []
    return sorted(top_level_bindings(tree))

_SHELL_ASSIGNMENT = re.compile(r"^\s*[A-Za-z_][\w.,\s]*=\s*[!%]")
_HELP_LINE = re.compile(r"^\s*[\w.]+\s*\?{1,2}\s*$")


def strip_ipython(source: str) -> tuple[str, list[str]]:
    """Remove IPython-only lines from one cell: a ``%%`` cell magic drops the whole cell;
    ``%line`` magics, ``!shell`` lines, ``x = !cmd`` and ``name?`` help lines become ``pass``
    (keeping blocks and line numbers intact). Returns the source and the lines removed."""
    lines = source.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("%%"):
        return "", [first]
    try:
        ast.parse(source)
        return source, []  # plain Python: nothing to strip
    except SyntaxError:
        pass
    removed: list[str] = []
    for index, line in enumerate(lines):
        stripped = line.lstrip()
        if (
            stripped.startswith(("%", "!"))
            or _SHELL_ASSIGNMENT.match(line)
            or _HELP_LINE.match(line)
        ):
            removed.append(stripped)
            lines[index] = line[: len(line) - len(stripped)] + "pass"
    return "\n".join(lines), removed



class IPythonCalls(ast.NodeTransformer):
    """``get_ipython().system(…)``, ``.run_line_magic(…)``, ``.run_cell_magic(…)`` — what
    Jupyter and Colab write for magics and ``!`` lines when a notebook is exported as
    ``.py`` — become ``pass``, like the magics of a notebook; a ``run_cell_magic`` of
    ``BODY_RUN_MAGICS`` becomes its body."""

    def strip(self, tree: ast.Module) -> list[str]:
        self.removed: list[str] = []
        self.ran: list[str] = []  # cell magics whose body was run (``BODY_RUN_MAGICS``)
        self.visit(tree)
        ast.fix_missing_locations(tree)
        return self.removed

    def _replace(self, node: ast.stmt, value: ast.expr):
        body = _cell_magic_body(value)
        if body is not None:  # run_cell_magic('time', '', 'body'): the body, as IPython runs it
            self.ran.append(ast.unparse(node)[:70])
            return [ast.copy_location(statement, node) for statement in body]
        if _calls_get_ipython(value):
            self.removed.append(ast.unparse(node)[:70])
            return ast.copy_location(ast.Pass(), node)
        return self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr):
        return self._replace(node, node.value)

    def visit_Assign(self, node: ast.Assign):
        return self._replace(node, node.value)


def _cell_magic_body(value: ast.expr) -> list[ast.stmt] | None:
    """The statements of ``get_ipython().run_cell_magic(NAME, LINE, BODY)`` when NAME is one
    of ``BODY_RUN_MAGICS`` and BODY a string that parses; else None."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr == "run_cell_magic" and _calls_get_ipython(value.func.value)
            and len(value.args) == 3
            and all(isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                    for arg in value.args)):
        return None
    if value.args[0].value not in BODY_RUN_MAGICS:
        return None
    try:
        return ast.parse(value.args[2].value).body
    except SyntaxError:
        return None


def _calls_get_ipython(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id == "get_ipython" for n in ast.walk(node))
