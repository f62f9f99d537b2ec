"""A self-check inside the student's notebook (or script), before they submit::

    import moco_ref.selfcheck
    moco_ref.selfcheck.run(globals())

What is graded is what the notebook or module holds: in IPython the cells it has run (``In``);
in a script its own source file (``__file__``); otherwise the namespace rebuilt — its
imports, its constants (literals) and the source of its own functions and classes. The code
goes to a temporary notebook (the folder is removed when the check is done) and is graded by
the same sandboxed grader as ``moco-ref grade``, definitions only; nothing of the student's
session runs in this process. The warm grading process started by the first self-check is
kept for the next ones (``sandbox.client.zygote_for``), so a second check in the same kernel
answers in about the time the judging takes.

Only what the course's rubric shows now is shown (``Rubric.shown_now``): no
other check's name, points or outcome, no inferred setting, and a score over the checks
shown. In Jupyter (JupyterHub, Colab) the summary table and the full feedback page are shown
inline (``IPython.display``; the page in a sandboxed ``iframe``); elsewhere plain text, the
page written beside the script (or to ``page``).
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

from moco_ref.judge.results import SubmissionReport

SELF_CHECK_NAME = "selfcheck.ipynb"
_LITERALS = (bool, int, float, complex, str, bytes, type(None))
_SKIPPED_NAMES = {"In", "Out", "_", "__", "___", "get_ipython", "exit", "quit"}


# --------------------------------------------------------------------------- what is graded


def cells_of(namespace: dict) -> list[str]:
    """The code the notebook or module holds, without the self-check itself: IPython's
    ``In`` history; else the module's source file (``__file__``); else the namespace
    rebuilt (``rebuilt_source``)."""
    history = namespace.get("In")
    if isinstance(history, list) and any(isinstance(cell, str) and cell.strip()
                                         for cell in history):
        return [cell for cell in history
                if isinstance(cell, str) and cell.strip() and "selfcheck" not in cell]
    source = _module_source(namespace)
    if source is not None:
        return [source] if source.strip() else []
    rebuilt = rebuilt_source(namespace)
    return [rebuilt] if rebuilt.strip() else []


def _module_source(namespace: dict) -> str | None:
    """The module's own file, its top-level statements that name the self-check left out;
    None when there is no such file or it is not the module (it does not parse)."""
    file = namespace.get("__file__")
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    try:
        source = Path(file).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    lines = source.splitlines(keepends=True)
    for node in reversed(tree.body):
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
        if "selfcheck" in "".join(lines[first - 1:node.end_lineno]):
            del lines[first - 1:node.end_lineno]
    return "".join(lines)


def rebuilt_source(namespace: dict) -> str:
    """A module with what ``namespace`` holds: its imports (modules, and functions or classes
    of other modules, by their import path), its constants (values a literal gives back
    exactly) and the source of its own functions and classes, in that order."""
    own = namespace.get("__name__")
    imports, constants, definitions = [], [], []
    for name, value in list(namespace.items()):
        if name in _SKIPPED_NAMES or (name.startswith("__") and name.endswith("__")):
            continue
        if inspect.ismodule(value):
            line = _module_import(name, value)
            if line:
                imports.append(line)
        elif inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
            if getattr(value, "__module__", None) == own:
                try:
                    definitions.append(inspect.getsource(value))
                except (OSError, TypeError):
                    continue
            else:
                line = _object_import(name, value)
                if line:
                    imports.append(line)
        elif _is_literal(value):
            constants.append(f"{name} = {value!r}\n")
    return "".join(imports) + "\n" + "".join(constants) + "\n" + "\n\n".join(definitions)


def _module_import(name: str, module) -> str:
    full = getattr(module, "__name__", "")
    if not full or full.split(".")[0] == "moco_ref":  # the self-check (or the reference)
        return ""
    if full == name:
        return f"import {name}\n"
    parent, _, last = full.rpartition(".")
    if parent and last == name:
        return f"from {parent} import {name}\n"
    return f"import {full} as {name}\n"


def _object_import(name: str, value) -> str:
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not module or module.split(".")[0] == "moco_ref" or not qualname.isidentifier() or \
            getattr(sys.modules.get(module), qualname, None) is not value:
        return ""
    return f"from {module} import {qualname}" + (f" as {name}\n" if name != qualname else "\n")


def _is_literal(value) -> bool:
    """Whether ``repr(value)`` is a literal that gives ``value`` back."""
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if isinstance(value, _LITERALS):
        return type(value) in _LITERALS
    if type(value) not in (tuple, list, dict, set, frozenset):
        return False
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return False


def write_notebook(cells: list[str], folder: Path) -> Path:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path = folder / SELF_CHECK_NAME
    nbformat.write(notebook, str(path))
    return path


# --------------------------------------------------------------------------- the check


@dataclass(repr=False)
class SelfCheckReport(SubmissionReport):
    """The report as the student may see it now (``student_view``)."""

    withheld: int = 0  # checks of the style the rubric does not show now

    def __repr__(self) -> str:  # the last value of a cell: short, and nothing withheld
        from moco_ref.report.formats import score_text

        return f"<moco-ref self-check: {score_text(self)}>"


def run(namespace: dict, *, rubric=None, style: str | None = None, show: bool = True,
        page=None) -> SelfCheckReport:
    """Grade the notebook's (or module's) code as it would be graded when submitted; returns
    what the student may see of the report (``student_view``) and — unless ``show`` is
    False — displays it. ``page``: also write the full feedback page there (outside
    Jupyter it goes beside the script by default)."""
    from moco_ref.judge.rubric import DEFAULT_RUBRIC, load_rubric
    from moco_ref.probe.options import GradeOptions
    from moco_ref.report.feedback import render_feedback
    from moco_ref.run.pipeline import grade_submission

    if isinstance(rubric, (str, Path)):
        rubric = load_rubric(rubric)
    rubric = rubric or DEFAULT_RUBRIC
    cells = cells_of(namespace)
    if not cells:
        raise ValueError("nothing to check: run the cells that define train_moco and "
                         "moco_warmup (or MoCo) first")
    with tempfile.TemporaryDirectory(prefix="moco-ref-selfcheck-") as folder:
        report = grade_submission(str(write_notebook(cells, Path(folder))),
                                  GradeOptions(style=style, rubric=rubric.to_pairs()))
        shown = student_view(report, rubric)
        html = render_feedback(shown, "html", rubric)
    inline = show and _in_notebook()
    if page is None and show and not inline:
        page = _page_beside(namespace)
    if page is not None:
        page = Path(page)
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(html, encoding="utf-8")
    if inline:
        from IPython.display import HTML, display

        display(HTML(html_table(shown, rubric, html)))
    elif show:
        print(plain_text(shown, rubric, page))
    return shown


def student_view(report: SubmissionReport, rubric) -> SelfCheckReport:
    """``report`` as the student sees it now (``report.student_view.StudentView``): only the
    checks the rubric shows now, each without the conclusions of the others; the score is
    over the checks shown."""
    from moco_ref.report.student_view import PAGE, StudentView

    view = StudentView(report, rubric, PAGE)
    applies_not = [r for r in report.results if r.check_id in view.not_applicable]
    counted = len(view.later) + len(view.hidden)
    data = {f.name: getattr(report, f.name) for f in fields(SubmissionReport)}
    data.update(results=view.shown + applies_not, notes=list(report.notes), withheld=counted,
                inferred=view.inferred, staff_notes=[])  # the staff's notes: never here
    if counted:
        data["notes"].append(f"{counted} check(s) of the course are not shown yet; the score "
                             "here counts the checks shown")
    return SelfCheckReport(**data)


# --------------------------------------------------------------------------- showing it


def visible_rows(report, rubric) -> list[tuple[str, str, str, str]]:
    """``(check, points, status, one-line reason)`` for the checks the rubric shows now."""
    from moco_ref.judge.results import Status
    from moco_ref.report.formats import reason_line
    from moco_ref.report.scoring import points_str

    rows = []
    for result in report.results:
        if result.status is Status.NOT_APPLICABLE or not rubric.shown_now(result.check_id):
            continue
        reason = "" if result.status is Status.PASSED else reason_line(result, 120)
        rows.append((result.check_id, f"{points_str(result.points)}/"
                     f"{points_str(result.max_points)}", result.status.value, reason))
    return rows


def _headline(report) -> str:
    from moco_ref.report.formats import score_text

    shown = " (the checks shown)" if getattr(report, "withheld", 0) else ""
    return f"moco-ref self-check: {score_text(report)}{shown}"


def plain_text(report, rubric, page: Path | None = None) -> str:
    lines = [_headline(report)]
    if not report.gradable:
        lines.append(report.traceback.strip().splitlines()[-1] if report.traceback else
                     "not gradable")
    for check, points, status, reason in visible_rows(report, rubric):
        lines.append(f"  {status:<11} {points:>12}  {check}" + (f"  — {reason}" if reason
                                                                else ""))
    if page is not None:
        lines.append(f"full feedback: {page}")
    return "\n".join(lines)


def html_table(report, rubric, page_html: str = "") -> str:
    """The summary table and, when given, the full page inline: in a sandboxed ``iframe``
    (``srcdoc``: no file, no link that a JupyterHub or Colab browser cannot open, and the
    page's styles stay inside it)."""
    from html import escape

    rows = "".join(
        f"<tr><td><code>{escape(check)}</code></td><td>{escape(points)}</td>"
        f"<td>{escape(status)}</td><td>{escape(reason)}</td></tr>"
        for check, points, status, reason in visible_rows(report, rubric))
    head = f"<p><b>{escape(_headline(report))}</b></p>"
    if not report.gradable and report.traceback:
        head += f"<pre>{escape(report.traceback.strip().splitlines()[-1])}</pre>"
    table = ("<table><tr><th>check</th><th>points</th><th>status</th><th>reason</th></tr>"
             f"{rows}</table>")
    if not page_html:
        return head + table
    frame = (f'<iframe sandbox="" srcdoc="{escape(page_html, quote=True)}" '
             'style="width: 100%; height: 36em; border: 1px solid #ccc"></iframe>')
    return f"{head}{table}<details><summary>full feedback</summary>{frame}</details>"


def _in_notebook() -> bool:
    """Whether output goes to a notebook front end (Jupyter's kernel, Colab), which shows
    HTML; a terminal IPython gets plain text."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    return "google.colab" in sys.modules or type(shell).__name__ == "ZMQInteractiveShell" \
        or getattr(shell, "kernel", None) is not None


def _page_beside(namespace: dict) -> Path:
    """``<script>.feedback.html`` beside the script, else ``selfcheck.feedback.html`` here."""
    file = namespace.get("__file__")
    if isinstance(file, str) and file.endswith(".py"):
        return Path(file).with_suffix(".feedback.html")
    return Path("selfcheck.feedback.html")
