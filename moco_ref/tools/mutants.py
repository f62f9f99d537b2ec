"""Single-point mutants of a MoCo solution, source to source: the file is parsed with ``ast``,
one node of a function the grader exercises is changed, and the module is written back with
``ast.unparse``. ``moco-ref sensitivity`` grades them to see which bugs the grader misses.

Each mutant has a stable id ``<operator>:<line>:<col>:<n>`` (the position of the changed node
in the original file; ``n`` counts the mutants of that operator at that position), so a
reviewed equivalents file can name it across runs. What is mutated: the bodies of the style's
entry points (``train_moco`` and ``moco_warmup`` for a lab submission, the methods of ``MoCo``
for a builder module, …) and of the module-level helpers they call. Never mutated: docstrings,
the ``views`` function and ``SEED`` (the grader replaces both, so expressions that use
``SEED`` are left alone too), function signatures and decorators.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from moco_ref.probe.styles import OBSERVED_STYLES, detect_style

OPERATORS = ("arith", "compare", "constant", "slice", "drop-arg", "drop-stmt", "swap-args",
             "dim", "method")
REPLACED_BY_GRADER = frozenset({"views", "SEED"})
DIM_KEYWORDS = ("dim", "axis")

_ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
          ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.MatMult: ast.Mult,
          ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr,
          ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr}
_COMPARE = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt,
            ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
            ast.In: ast.NotIn, ast.NotIn: ast.In}
_METHOD_PAIRS = (("mul_", "add_"), ("mul", "add"), ("max", "min"), ("amax", "amin"),
                 ("argmax", "argmin"), ("sum", "mean"), ("zeros", "ones"),
                 ("zeros_like", "ones_like"), ("cat", "stack"), ("no_grad", "enable_grad"))
METHOD_SWAPS = {a: b for pair in _METHOD_PAIRS for a, b in (pair, pair[::-1])}
# calls replaced by their first argument (``x.detach()`` → ``x``, ``F.normalize(x)`` → ``x``)
CALLS_REMOVED = ("detach", "clone", "normalize")
DESCRIPTION_WIDTH = 30  # each side of a description: "  line 123: …" fits 80 columns


@dataclass(frozen=True)
class Mutant:
    id: str  # "<operator>:<line>:<col>:<n>", stable while the file is unchanged
    operator: str
    line: int
    col: int
    description: str  # "line 70: '-capacity:' → 'capacity:'"
    source: str  # the whole mutated module
    original_line: str = ""  # the line of the original file it changes


@dataclass
class MutantSet:
    style: str
    functions: tuple[str, ...]  # the qualified names whose bodies were mutated
    original: str  # the unmutated module as ast.unparse writes it
    mutants: list[Mutant] = field(default_factory=list)  # each compiles
    not_compiling: list[Mutant] = field(default_factory=list)
    duplicates: int = 0  # mutations that wrote the same module as an earlier one
    no_ops: int = 0  # mutations that wrote the unmutated module

    @property
    def generated(self) -> int:
        return len(self.mutants) + len(self.not_compiling)


def module_style(tree: ast.Module) -> str:
    """The style ``moco-ref grade`` would detect from the module's top-level definitions
    (``observe.styles.detect_style`` on stand-ins for them); ``ValueError`` when none fits."""
    namespace: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            namespace[node.name] = type(node.name, (), {})
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            namespace[node.name] = _stand_in
    return detect_style(namespace)


def _stand_in() -> None:  # a callable standing in for a function of the submission
    return None


# --------------------------------------------------------------------------- where to mutate


def _docstring(body: list[ast.stmt]) -> ast.stmt | None:
    first = body[0] if body else None
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return first
    return None


def _targets(tree: ast.Module, style: str) -> list[tuple[str, ast.AST]]:
    """The definitions whose bodies are mutated, ``(qualified name, def)``: the style's entry
    points and, transitively, the module-level functions and classes they refer to."""
    definitions = {node.name: node for node in tree.body
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    observed = OBSERVED_STYLES[style]
    wanted = list(observed.entry_points)
    for part in observed.parts:
        wanted += [name for name in part.entry_points if name not in wanted]
    chosen: list[str] = []
    pending = [name for name in wanted if name in definitions]
    while pending:
        name = pending.pop(0)
        if name in chosen or name in REPLACED_BY_GRADER:
            continue
        chosen.append(name)
        for node in ast.walk(definitions[name]):
            if isinstance(node, ast.Name) and node.id in definitions and node.id not in chosen:
                pending.append(node.id)
    found: list[tuple[str, ast.AST]] = []
    for name, node in definitions.items():  # in the module's order
        if name not in chosen:
            continue
        if isinstance(node, ast.ClassDef):
            found += [(f"{name}.{item.name}", item) for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
        else:
            found.append((name, node))
    return found


def _preorder(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _preorder(child)


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _mutable_nodes(tree: ast.Module, style: str) -> tuple[list[ast.AST], set[int]]:
    """Every node of the module in a fixed order, and the ids of those that may be mutated."""
    nodes = list(_preorder(tree))
    allowed: set[int] = set()
    for _, definition in _targets(tree, style):
        doc = _docstring(definition.body)
        for statement in definition.body:
            if statement is not doc:
                allowed.update(id(node) for node in _preorder(statement))
    parents = _parents(tree)
    for node in nodes:  # an expression using SEED is the grader's choice of seed
        if isinstance(node, ast.Name) and node.id in REPLACED_BY_GRADER and id(node) in allowed:
            top = node
            while not isinstance(parents.get(id(top)), (ast.stmt, type(None))):
                top = parents[id(top)]
            allowed.difference_update(id(inner) for inner in _preorder(top))
    return nodes, allowed


# --------------------------------------------------------------------------- the operators

Change = Callable[[ast.AST], ast.AST]  # applied to a fresh copy of the node: its replacement


def _with_op(op_type) -> Change:
    def change(node):
        node.op = op_type()
        return node
    return change


def _arith(node: ast.AST) -> Iterator[Change]:
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _ARITH:
        yield _with_op(_ARITH[type(node.op)])
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Invert)):
        yield lambda n: n.operand


def _compare(node: ast.AST) -> Iterator[Change]:
    if not isinstance(node, ast.Compare):
        return
    for index, op in enumerate(node.ops):
        if type(op) in _COMPARE:
            def change(n, index=index):
                n.ops[index] = _COMPARE[type(n.ops[index])]()
                return n
            yield change


def _is_number(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool))


def _constant_values(value) -> list:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, 0] if value != 0 else [1]
    return [value * 2, 0.0] if value != 0 else [1.0]


def _constant(node: ast.AST, parent: ast.AST | None) -> Iterator[Change]:
    if not isinstance(node, ast.Constant) or not isinstance(node.value, (int, float)):
        return
    if isinstance(parent, ast.keyword) and parent.arg in DIM_KEYWORDS:
        return  # the dim operator changes dim=/axis=
    for value in _constant_values(node.value):
        yield lambda n, value=value: ast.Constant(value)


def _negated(expr: ast.expr) -> ast.expr:
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return expr.operand
    return ast.UnaryOp(ast.USub(), expr)


def _slice(node: ast.AST) -> Iterator[Change]:
    if not isinstance(node, ast.Slice):
        return
    for bound in ("lower", "upper"):
        if getattr(node, bound) is not None:
            def drop(n, bound=bound):
                setattr(n, bound, None)
                return n
            yield drop
    for bound in ("lower", "upper"):
        if getattr(node, bound) is not None:
            def negate(n, bound=bound):
                setattr(n, bound, _negated(getattr(n, bound)))
                return n
            yield negate


def _drop_arg(node: ast.AST) -> Iterator[Change]:
    if not isinstance(node, ast.Call):
        return
    for index in range(len(node.args)):
        def drop(n, index=index):
            del n.args[index]
            return n
        yield drop
    for index in range(len(node.keywords)):
        def drop_keyword(n, index=index):
            del n.keywords[index]
            return n
        yield drop_keyword


def _drop_stmt(node: ast.AST) -> Iterator[Change]:
    if isinstance(node, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)):
        yield lambda n: ast.Pass()


def _swap_args(node: ast.AST) -> Iterator[Change]:
    if isinstance(node, ast.Call) and len(node.args) >= 2:
        def swap(n):
            n.args[0], n.args[1] = n.args[1], n.args[0]
            return n
        yield swap


def _dim(node: ast.AST) -> Iterator[Change]:
    if (isinstance(node, ast.keyword) and node.arg in DIM_KEYWORDS):
        value = node.value
        if _is_number(value) or (isinstance(value, ast.UnaryOp) and _is_number(value.operand)):
            current = ast.literal_eval(value)
            new = {1: 0, 0: 1}.get(current, 0)

            def change(n, new=new):
                n.value = ast.Constant(new)
                return n
            yield change
    elif isinstance(node, ast.Attribute) and node.attr == "T" and isinstance(node.ctx, ast.Load):
        yield lambda n: n.value


def _method(node: ast.AST) -> Iterator[Change]:
    if isinstance(node, ast.Attribute) and node.attr in METHOD_SWAPS:
        def rename(n):
            n.attr = METHOD_SWAPS[n.attr]
            return n
        yield rename
    elif isinstance(node, ast.Name) and node.id in METHOD_SWAPS and isinstance(node.ctx, ast.Load):
        def rename_name(n):
            n.id = METHOD_SWAPS[n.id]
            return n
        yield rename_name
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        name = node.func.attr
        if name in ("detach", "clone") and not node.args and not node.keywords:
            yield lambda n: n.func.value  # x.detach() → x
        elif name in CALLS_REMOVED and node.args and not isinstance(node.args[0], ast.Starred):
            yield lambda n: n.args[0]  # F.normalize(x, dim=1) → x


def _changes(node: ast.AST, parent: ast.AST | None) -> Iterator[tuple[str, Change]]:
    """Every mutation of ``node``, in a fixed order: ``(operator, change)``."""
    for operator, found in (("arith", _arith(node)), ("compare", _compare(node)),
                            ("constant", _constant(node, parent)), ("slice", _slice(node)),
                            ("drop-arg", _drop_arg(node)), ("drop-stmt", _drop_stmt(node)),
                            ("swap-args", _swap_args(node)), ("dim", _dim(node)),
                            ("method", _method(node))):
        for change in found:
            yield operator, change


# --------------------------------------------------------------------------- writing them


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for name, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, name, new)
                return
            if isinstance(value, list):
                for index, item in enumerate(value):
                    if item is old:
                        value[index] = new
                        return
    raise LookupError("the node to mutate is not in the tree")


def _shortened(before: str, after: str) -> tuple[str, str]:
    """``before`` and ``after`` cut to ``DESCRIPTION_WIDTH`` each around where they differ,
    the same cuts on both sides (``…`` where text was left out)."""
    before, after = " ".join(before.split()), " ".join(after.split())
    if max(len(before), len(after)) <= DESCRIPTION_WIDTH:
        return before, after
    prefix = 0
    while prefix < min(len(before), len(after)) and before[prefix] == after[prefix]:
        prefix += 1
    suffix = 0
    while (suffix < min(len(before), len(after)) - prefix
           and before[-1 - suffix] == after[-1 - suffix]):
        suffix += 1
    context = 10
    room = DESCRIPTION_WIDTH - min(prefix, context + 1) - min(suffix, context + 1) - 2

    def cut(text: str) -> str:
        middle = text[prefix:len(text) - suffix]
        if len(middle) > room:
            middle = middle[:room - 1] + "…"
        head = text[:prefix] if prefix <= context + 1 else "…" + text[prefix - context:prefix]
        tail_start = len(text) - suffix
        tail = (text[tail_start:] if suffix <= context + 1
                else text[tail_start:tail_start + context] + "…")
        return head + middle + tail

    return cut(before), cut(after)


def _shown(node: ast.AST, parents: dict[int, ast.AST]) -> ast.AST:
    """What a description shows of a change to ``node``: the node, or for a short one (a
    constant, a name) the expression around it, so that the description says which one; a
    keyword argument (``dim=1``) says so itself."""
    shown = node
    while len(ast.unparse(shown)) < 12 and not isinstance(shown, ast.keyword):
        parent = parents.get(id(shown))
        if parent is None or isinstance(parent, (ast.stmt, ast.mod)):
            break
        shown = parent
    return shown


def _compiles(source: str, filename: str) -> bool:
    try:
        compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def generate(source: str, filename: str = "<solution>", style: str | None = None) -> MutantSet:
    """Every single-point mutant of ``source`` (see the module's docstring). ``style`` is
    detected from the module's definitions when not given."""
    tree = ast.parse(source, filename)
    style = style or module_style(tree)
    original = ast.unparse(tree)
    lines = source.splitlines()
    nodes, allowed = _mutable_nodes(tree, style)
    parents = _parents(tree)
    result = MutantSet(style, tuple(name for name, _ in _targets(tree, style)), original)
    seen = {original}
    counters: dict[tuple[str, int, int], int] = {}
    for index, node in enumerate(nodes):
        if id(node) not in allowed:
            continue
        for variant, (operator, _) in enumerate(_changes(node, parents.get(id(node)))):
            fresh = ast.parse(source, filename)
            fresh_node = list(_preorder(fresh))[index]
            fresh_parents = _parents(fresh)
            _, change = list(_changes(fresh_node, fresh_parents.get(id(fresh_node))))[variant]
            shown = _shown(fresh_node, fresh_parents)
            before = ast.unparse(shown)
            replacement = change(fresh_node)
            if replacement is not fresh_node:
                _replace(fresh, fresh_node, replacement)
            after = ast.unparse(replacement if shown is fresh_node else shown)
            before, after = _shortened(before, after)
            ast.fix_missing_locations(fresh)
            try:
                mutated = ast.unparse(fresh)
            except Exception:  # noqa: BLE001 - a tree ast.unparse cannot write: not compiling
                mutated = ""
            line, col = getattr(node, "lineno", 0), getattr(node, "col_offset", 0)
            if mutated in seen:
                result.no_ops += mutated == original
                result.duplicates += mutated != original
                continue
            if mutated:
                seen.add(mutated)
            key = (operator, line, col)
            number = counters.get(key, 0)
            counters[key] = number + 1
            mutant = Mutant(
                id=f"{operator}:{line}:{col}:{number}", operator=operator, line=line, col=col,
                description=f"line {line}: '{before}' → '{after}'",
                source=mutated + "\n", original_line=lines[line - 1].strip() if line else "")
            if mutated and _compiles(mutated, filename):
                result.mutants.append(mutant)
            else:
                result.not_compiling.append(mutant)
    return result
