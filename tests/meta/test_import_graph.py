"""The import graph, read by grimp (which import-linter brings): no import circle but the check
registry's, which is the registration pattern (each check module registers with the registry,
and the registry imports the check modules to fill itself)."""

from __future__ import annotations

import grimp

REGISTRY_CIRCLE = "moco_ref.judge.checks"  # the registry and the check modules, together
MAX_GRADER_MODULE_LINES = 500


def _strongly_connected(graph) -> list[set[str]]:
    """Tarjan's components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = [0]

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(
                        child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_the_finder_finds_a_circle():
    """Meta: the search sees a two-module circle and a three-module one, and no false one."""
    graph = grimp.ImportGraph()
    for name in ("a", "b", "c", "d", "e", "f"):
        graph.add_module(name)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="a")
    graph.add_import(importer="c", imported="d")
    graph.add_import(importer="d", imported="e")
    graph.add_import(importer="e", imported="c")
    graph.add_import(importer="f", imported="a")
    assert sorted(map(sorted, _strongly_connected(graph))) == [["a", "b"], ["c", "d", "e"]]


def test_no_import_circle_but_the_check_registry_s():
    # an import under ``if TYPE_CHECKING:`` never runs: it names a type for the reader
    graph = grimp.build_graph("moco_ref", exclude_type_checking_imports=True)
    circles = [sorted(component) for component in _strongly_connected(graph)
               if not all(m == "moco_ref.judge.registry" or m.startswith(REGISTRY_CIRCLE)
                          for m in component)]
    assert circles == [], f"import circles: {circles}"


def test_a_long_module_says_why_it_is_long():
    """Small modules with one job each: a module over ~500 lines says in its docstring why it
    is one module (the words "Long on purpose")."""
    import ast
    from pathlib import Path

    import moco_ref

    root = Path(moco_ref.__file__).parent
    unexplained = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_GRADER_MODULE_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "Long on purpose" not in doc:
                unexplained.append(f"{path.relative_to(root)} ({text.count(chr(10))} lines)")
    assert unexplained == []
