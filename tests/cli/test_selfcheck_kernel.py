"""The self-check as a student runs it (issue 28.7): in plain Python — a script that calls
it at its top level, graded with its imports and constants — and in a real Jupyter kernel
(nbclient): the page inline, no temporary folder left, the second check answered by the
warm process; and with a course rubric, no word of a check the student cannot see."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moco_ref import selfcheck
from moco_ref.judge.rubric import rubric_from_mapping
from moco_ref.report.student_view import NOT_YET
from tests.helpers.conformance_support import ROOT, SUBMISSIONS

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

CALL = "import moco_ref.selfcheck\nmoco_ref.selfcheck.run(globals())\n"


def _body(name: str) -> str:
    """The submission without its docstring."""
    return (SUBMISSIONS / name).read_text(encoding="utf-8").split('"""', 2)[2]


def _leftovers(folder: Path) -> list[Path]:
    return sorted(folder.glob("moco-ref-selfcheck-*"))


def test_a_correct_script_that_calls_the_self_check_gets_full_marks(tmp_path):
    """Its imports (``torch``, ``F``, ``np``) and constants (``SEED``) are graded with it:
    they were dropped, and the run died with ``NameError: torch`` (0 points)."""
    script = tmp_path / "lab07.py"
    script.write_text(_body("correct_lab_order.py") + "\n\n" + CALL, encoding="utf-8")
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("moco-ref self-check: 100/100"), run.stdout[-2000:]
    assert "NameError" not in run.stdout
    page = tmp_path / "lab07.feedback.html"
    assert f"full feedback: {page}" in run.stdout and page.is_file()
    assert not _leftovers(temp)


def test_a_namespace_without_its_file_is_rebuilt_with_imports_and_constants():
    namespace = {"__name__": "student_module"}
    exec(compile(_body("correct_lab_order.py"), "<student>", "exec"), namespace)
    source = selfcheck.rebuilt_source(namespace)
    for line in ("import copy", "import numpy as np", "import torch",
                 "import torch.nn.functional as F", "SEED = 7"):
        assert re.search(rf"^{re.escape(line)}$", source, re.MULTILINE), line
    assert "selfcheck" not in source


def test_with_a_course_rubric_no_check_the_student_cannot_see_is_named(tmp_path,
                                                                      capsys):
    """The contract family is withheld; it is the family whose first check tells the crash
    in full, which every other check pointed at ("told in full under …")."""
    script = tmp_path / "crashes.py"
    script.write_text(_body("bug_crash_when_queue_full.py"), encoding="utf-8")
    rubric = rubric_from_mapping({"visibility": {"contract": "after_due_date",
                                                 "I9": "hidden"}})
    page = tmp_path / "page.html"
    report = selfcheck.run({"__name__": "__main__", "__file__": str(script)}, rubric=rubric,
                           page=page)
    out, html = capsys.readouterr().out, page.read_text(encoding="utf-8")
    shown = selfcheck.html_table(report, rubric, html)
    for text in (out, html, shown, repr(report)):
        assert "contract-" not in text and "I9-" not in text
    assert "not shown yet" in out  # it says it waits, not for what
    assert any(r.message == NOT_YET for r in report.results)
    assert all(not r.check_id.startswith(("contract", "I9")) for r in report.results)
    assert report.max_score < 100 and "(the checks shown)" in out
    assert set(report.inferred) <= {"style"}  # nothing that could tell a withheld outcome


def _notebook(tmp_path: Path):
    import nbformat

    cells = [chunk.strip() for chunk in re.split(r"\n\n\n", _body("correct_lab_order.py"))
             if chunk.strip()]
    check = ("import glob, os, tempfile\n"
             "before = set(glob.glob(os.path.join(tempfile.gettempdir(), "
             "'moco-ref-selfcheck-*')))\n"
             "import moco_ref.selfcheck\n"
             "from moco_ref.sandbox import client\n"
             "report = moco_ref.selfcheck.run(globals())\n"
             "print('warm', sorted(z.process.pid for z in client._ZYGOTES.values()))\n"
             "print('left', len(set(glob.glob(os.path.join(tempfile.gettempdir(), "
             "'moco-ref-selfcheck-*'))) - before))\n"
             "report")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
    notebook.cells += [nbformat.v4.new_code_cell(check), nbformat.v4.new_code_cell(check)]
    return notebook


def test_in_a_jupyter_kernel_the_page_is_inline_and_the_second_check_is_warm(tmp_path):
    pytest.importorskip("ipykernel")
    nbclient = pytest.importorskip("nbclient")
    notebook = _notebook(tmp_path)
    env = {"PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the kernel inherits them
    try:
        nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    first, second = notebook.cells[-2:]
    for cell in (first, second):
        html = next(out["data"]["text/html"] for out in cell.outputs
                    if out.output_type == "display_data")
        assert "moco-ref self-check: 100/100" in html
        assert "file://" not in html and "<iframe" in html and "srcdoc=" in html
        text = "".join(out.get("text", "") for out in cell.outputs
                       if out.output_type == "stream")
        assert "left 0" in text  # its temporary folder is gone
        result = next(out["data"]["text/plain"] for out in cell.outputs
                      if out.output_type == "execute_result")
        assert result == "<moco-ref self-check: 100/100>"  # not the whole report
    def warm(cell) -> str:
        return re.search(r"warm (\[[\d, ]*\])", "".join(
            out.get("text", "") for out in cell.outputs)).group(1)

    # the second check was answered by the warm process the first one started (how fast
    # that is, is the benchmarks' to measure)
    assert warm(first) == warm(second) != "[]"
    assert not _leftovers(tmp_path)
