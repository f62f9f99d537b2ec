"""Code that inspects the grader's world: told to staff, never to the student.

A submission can behave one way under grading and another in the student's own notebook by
looking at what it is handed or where it runs. Where the grader cannot make its run look like
the course's own at little cost, it names such code for the course staff: a read of an
object's type, module or class name, of ``inspect``, ``sys.modules``, the environment, the
host or the user, and a branch on the size or the statistics of what it is given. Each note
names the line. The scan reads the source without running it; it is evidence for a human,
never a verdict (no check's points depend on it), and a student never sees it
(``SubmissionReport.staff_notes``).
"""

from __future__ import annotations

import ast
from pathlib import Path

# attribute reads that tell what an object is, rather than what it holds
TYPE_ATTRIBUTES = {"__module__": "an object's module", "__qualname__": "a class's name"}
# calls and reads of the world around the code
WORLD = {
    ("os", "environ"): "the environment variables", ("os", "getenv"): "an environment variable",
    ("sys", "modules"): "the modules loaded in the process", ("sys", "argv"): "the command line",
    ("socket", "gethostname"): "the host name", ("platform", "node"): "the host name",
    ("os", "uname"): "the host", ("getpass", "getuser"): "the user",
    ("os", "getpid"): "the process", ("os", "getcwd"): "the working folder",
    ("os", "listdir"): "a folder's contents",
}
WORLD_MODULES = {"inspect": "the caller's frames and source (inspect)",
                 "gc": "every live object (gc)", "traceback": "the call stack (traceback)"}
STATISTICS = {"mean", "std", "var", "max", "min", "sum", "median", "unique", "amax", "amin"}
SIZES = {"shape", "size", "numel", "__len__", "dtype", "device"}
SIZE_CONSTANT = 1000  # a branch on a size against a constant this large is a size gate
MAX_NOTES = 12


def inspection_notes(path: str | Path) -> list[str]:
    """``line N: <what> (<the line>)`` for each place the submission at ``path`` inspects the
    grader's world or gates on its input's size or statistics; [] when none or unreadable."""
    from moco_ref.probe.source import module_trees

    trees = module_trees(Path(path))
    if not trees:
        return []
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    found: dict[tuple[int, str], None] = {}
    for tree in trees:
        for node in ast.walk(tree):
            what = _what(node)
            if what:
                found[(getattr(node, "lineno", 0), what)] = None
    notes = []
    for lineno, what in sorted(found)[:MAX_NOTES]:
        code = lines[lineno - 1].strip()[:80] if Path(path).suffix == ".py" and \
            0 < lineno <= len(lines) else ""
        notes.append(f"line {lineno}: reads {what}" + (f" (`{code}`)" if code else "")
                     + " — code that can tell the grader's run from the course's own")
    return notes


def _what(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        if node.attr in TYPE_ATTRIBUTES:
            return TYPE_ATTRIBUTES[node.attr]
        if node.attr == "__name__" and _names_a_type(node.value):
            return "an object's class name"
        if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in WORLD:
            return WORLD[(node.value.id, node.attr)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
            node.module or ""]
        for name in names:
            if name.split(".")[0] in WORLD_MODULES:
                return WORLD_MODULES[name.split(".")[0]]
        if isinstance(node, ast.ImportFrom) and any(
                (node.module, alias.name) in WORLD for alias in node.names):
            alias = next(a for a in node.names if (node.module, a.name) in WORLD)
            return WORLD[(node.module, alias.name)]
    if isinstance(node, (ast.If, ast.IfExp, ast.While)) and _gates_on_input(node.test):
        return "the size or the statistics of its input in a branch"
    return None


def _names_a_type(node: ast.expr) -> bool:
    """``type(x)`` or ``x.__class__``: what ``.__name__`` then reads is the object's class."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "type") or (isinstance(node, ast.Attribute)
                                            and node.attr == "__class__")


def _gates_on_input(test: ast.expr) -> bool:
    statistics = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr in STATISTICS for n in ast.walk(test))
    compared = [n for n in ast.walk(test) if isinstance(n, ast.Compare)]
    if statistics and compared:
        return any(_has_number(c, lambda v: isinstance(v, float) or abs(v) > 1) for c in compared)
    for compare in compared:
        sized = any(_is_size(n) for n in ast.walk(compare))
        if sized and _has_number(compare, lambda v: abs(v) >= SIZE_CONSTANT):
            return True
    return False


def _is_size(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr in SIZES:
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in SIZES


def _has_number(node: ast.AST, wanted) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, (int, float))
               and not isinstance(n.value, bool) and wanted(n.value) for n in ast.walk(node))
