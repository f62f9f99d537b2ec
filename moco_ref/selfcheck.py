"""A self-check inside the student's notebook, before they submit::

    import moco_ref.selfcheck
    moco_ref.selfcheck.run(globals())

The cells the notebook has run (IPython's ``In``; or, outside IPython, the source of the
functions and classes in ``namespace``) are written to a temporary notebook and graded by the
same sandboxed grader as ``moco-ref grade``, definitions only. The rubric's visible checks
are shown: an HTML table inline in Jupyter (``IPython.display``), plain text elsewhere, with a
link to the full feedback page. Nothing of the student's session is run in this process.
"""

from __future__ import annotations

import inspect
import tempfile
from pathlib import Path

SELF_CHECK_NAME = "selfcheck.ipynb"


def cells_of(namespace: dict) -> list[str]:
    """The code the notebook ran: IPython's ``In`` history (without the self-check call
    itself), or the source of the namespace's own functions and classes."""
    history = namespace.get("In")
    if isinstance(history, list) and any(isinstance(cell, str) and cell.strip()
                                         for cell in history):
        return [cell for cell in history
                if isinstance(cell, str) and cell.strip() and "selfcheck" not in cell]
    cells = []
    for value in list(namespace.values()):
        if (inspect.isfunction(value) or inspect.isclass(value)) and \
                getattr(value, "__module__", None) == namespace.get("__name__"):
            try:
                cells.append(inspect.getsource(value))
            except (OSError, TypeError):
                continue
    return cells


def write_notebook(cells: list[str], folder: Path) -> Path:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path = folder / SELF_CHECK_NAME
    nbformat.write(notebook, str(path))
    return path


def run(namespace: dict, *, rubric=None, style: str | None = None, show: bool = True):
    """Grade the notebook's code as it would be graded when submitted; returns the report
    (and displays the visible checks unless ``show`` is False)."""
    from moco_ref.judge.rubric import DEFAULT_RUBRIC, load_rubric
    from moco_ref.probe.options import GradeOptions
    from moco_ref.report.feedback import write_feedback
    from moco_ref.run.pipeline import grade_submission

    if isinstance(rubric, (str, Path)):
        rubric = load_rubric(rubric)
    rubric = rubric or DEFAULT_RUBRIC
    cells = cells_of(namespace)
    folder = Path(tempfile.mkdtemp(prefix="moco-ref-selfcheck-"))
    if not cells:
        raise ValueError("nothing to check: run the cells that define train_moco and "
                         "moco_warmup (or MoCo) first")
    report = grade_submission(str(write_notebook(cells, folder)),
                              GradeOptions(style=style, rubric=rubric.to_pairs()))
    page = folder / "feedback.html"
    write_feedback(report, page, "html", rubric)
    if show:
        _display(report, rubric, page)
    return report


def visible_rows(report, rubric) -> list[tuple[str, str, str, str]]:
    """``(check, points, status, one-line reason)`` for the checks the rubric shows now."""
    from moco_ref.judge.results import Status
    from moco_ref.report.formats import reason_line
    from moco_ref.report.scoring import points_str

    rows = []
    for result in report.results:
        if result.status is Status.NOT_APPLICABLE or rubric.visibility_of(
                result.check_id) != "visible":
            continue
        reason = "" if result.status is Status.PASSED else reason_line(result, 120)
        rows.append((result.check_id, f"{points_str(result.points)}/"
                     f"{points_str(result.max_points)}", result.status.value, reason))
    return rows


def plain_text(report, rubric, page: Path) -> str:
    from moco_ref.report.formats import score_text

    lines = [f"moco-ref self-check: {score_text(report)}"]
    if not report.gradable:
        lines.append(report.traceback.strip().splitlines()[-1] if report.traceback else
                     "not gradable")
    for check, points, status, reason in visible_rows(report, rubric):
        lines.append(f"  {status:<11} {points:>12}  {check}" + (f"  — {reason}" if reason
                                                                else ""))
    lines.append(f"full feedback: {page}")
    return "\n".join(lines)


def html_table(report, rubric, page: Path) -> str:
    from html import escape

    from moco_ref.report.formats import score_text

    rows = "".join(
        f"<tr><td><code>{escape(check)}</code></td><td>{escape(points)}</td>"
        f"<td>{escape(status)}</td><td>{escape(reason)}</td></tr>"
        for check, points, status, reason in visible_rows(report, rubric))
    return (f"<p><b>moco-ref self-check: {escape(score_text(report))}</b> — "
            f"<a href=\"{escape(page.as_uri())}\">full feedback</a></p>"
            "<table><tr><th>check</th><th>points</th><th>status</th><th>reason</th></tr>"
            f"{rows}</table>")


def _display(report, rubric, page: Path) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display

        if get_ipython() is not None:
            display(HTML(html_table(report, rubric, page)))
            return
    except ImportError:
        pass
    print(plain_text(report, rubric, page))
