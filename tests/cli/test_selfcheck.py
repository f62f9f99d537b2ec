"""The self-check a student runs inside the notebook before submitting."""

from __future__ import annotations

import nbformat
import pytest

from moco_ref import selfcheck
from moco_ref.judge.rubric import rubric_from_mapping
from tests.helpers.conformance_support import SUBMISSIONS


def _notebook_history(name: str) -> list[str]:
    notebook = nbformat.read(str(SUBMISSIONS / name), as_version=4)
    return ["", *(c.source for c in notebook.cells if c.cell_type == "code"),
            "import moco_ref.selfcheck\nmoco_ref.selfcheck.run(globals())"]


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_the_cells_the_notebook_ran_are_graded_as_a_submission(capsys, tmp_path,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside IPython the page is written here
    namespace = {"__name__": "__main__", "In": _notebook_history("correct_notebook.ipynb")}
    assert not any("selfcheck" in cell for cell in selfcheck.cells_of(namespace))
    hidden = rubric_from_mapping({"visibility": {"I4": "hidden"}})
    report = selfcheck.run(namespace, rubric=hidden)  # outside IPython: plain text
    assert report.gradable and report.score == report.max_score
    out = capsys.readouterr().out
    # the score over the checks shown: the hidden I4 share is not in it
    assert out.startswith(f"moco-ref self-check: {report.score:g}/{report.max_score:g} "
                          "(the checks shown)") and report.max_score < 100
    assert "I3-fifo-keeps-newest" in out and "I4-same-source-masked" not in out
    assert "full feedback: " in out and out.strip().endswith("feedback.html")
    assert (tmp_path / "selfcheck.feedback.html").is_file()


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_the_html_table_names_a_failure_and_shows_the_page_inline():
    namespace = {"__name__": "__main__",
                 "In": ["", (SUBMISSIONS / "bug_no_mask.py").read_text()]}
    report = selfcheck.run(namespace, show=False)
    table = selfcheck.html_table(report, rubric_from_mapping({}), "<html>the page</html>")
    assert "<table>" in table and "I4-same-source-masked" in table and "failed" in table
    # the page inline (a JupyterHub or Colab browser cannot open a file:// link)
    assert "file://" not in table and 'srcdoc="&lt;html&gt;the page&lt;/html&gt;"' in table
