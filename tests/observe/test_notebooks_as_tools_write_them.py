"""One LAB notebook as the tools students use write it (issue 37, item 2): nbformat 4.0 and
4.5, a Colab export (its metadata, widget state, saved outputs and a saved error), nbconvert's
``--to script``, Jupytext's percent (VS Code) and light formats, and file names in other
scripts. Each is read to the same entry points; a few are graded whole in the sandbox."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import nbformat
import pytest

from moco_ref.observe.loader import load_submission

NOTEBOOK = (Path(__file__).resolve().parents[2] / "examples" / "submissions"
            / "correct_notebook.ipynb")


def _cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]


def _text(cell: dict) -> str:
    source = cell["source"]
    return "".join(source) if isinstance(source, list) else source


def nbformat_4_0() -> str:
    """An old Jupyter's file: no cell ids, minor version 0, sources as lists of lines."""
    notebook = nbformat.v4.new_notebook()
    notebook.nbformat_minor = 0
    for cell in _cells():
        made = (nbformat.v4.new_markdown_cell(_text(cell)) if cell["cell_type"] == "markdown"
                else nbformat.v4.new_code_cell(_text(cell)))
        made.pop("id", None)
        notebook.cells.append(made)
    data = json.loads(nbformat.writes(notebook, version=4))
    for cell in data["cells"]:
        cell.pop("id", None)
        source = cell["source"]
        cell["source"] = source.splitlines(keepends=True) if isinstance(source, str) else source
    return json.dumps(data, indent=1)


def nbformat_4_5() -> str:
    notebook = nbformat.v4.new_notebook()
    for cell in _cells():
        notebook.cells.append(nbformat.v4.new_markdown_cell(_text(cell))
                              if cell["cell_type"] == "markdown"
                              else nbformat.v4.new_code_cell(_text(cell)))
    nbformat.validate(notebook)
    return nbformat.writes(notebook)


def colab_export() -> str:
    """What File → Download .ipynb gives: Colab's metadata and widget state, execution
    counts, stream and image outputs, and the error a cell raised when it was last run."""
    cells = copy.deepcopy(_cells())
    for number, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        cell["execution_count"] = number + 1
        cell["metadata"] = {"id": f"cell{number:04d}", "colab": {"base_uri": "https://x/"},
                            "outputId": "0f3c"}
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["epoch 0\n"]}]
    code = [c for c in cells if c["cell_type"] == "code"]
    code[-1]["outputs"].append({
        "output_type": "error", "ename": "RuntimeError", "evalue": "CUDA out of memory",
        "traceback": ["\x1b[0;31m---------------------------------------------------------\x1b[0m",
                      "\x1b[0;31mRuntimeError\x1b[0m: CUDA out of memory"]})
    code[0]["outputs"].append({"output_type": "display_data", "metadata": {},
                               "data": {"image/png": "iVBORw0KGgo=", "text/plain": ["<Figure>"]}})
    metadata = {"colab": {"provenance": [], "gpuType": "T4"}, "accelerator": "GPU",
                "kernelspec": {"name": "python3", "display_name": "Python 3"},
                "language_info": {"name": "python"},
                "widgets": {"application/vnd.jupyter.widget-state+json": {
                    "a1b2": {"model_name": "HBoxModel", "model_module": "@jupyter-widgets/controls",
                             "model_module_version": "1.5.0", "state": {"children": []}}}}}
    return json.dumps({"nbformat": 4, "nbformat_minor": 0, "metadata": metadata,
                       "cells": cells}, ensure_ascii=False, indent=2)


def _magic_as(line: str, style: str) -> str:
    """A notebook line starting with ``!``/``%`` as each exporter writes it."""
    if not line.lstrip().startswith(("!", "%")):
        return line
    if style == "nbconvert":
        command = line.strip()
        if command.startswith("!"):
            return f"get_ipython().system({command[1:]!r})"
        name, _, rest = command.lstrip("%").partition(" ")
        return f"get_ipython().run_line_magic({name!r}, {rest!r})"
    return "# " + line  # Jupytext comments magics out


def nbconvert_script() -> str:
    parts = ["#!/usr/bin/env python", "# coding: utf-8", ""]
    for number, cell in enumerate(_cells()):
        if cell["cell_type"] == "markdown":
            parts += ["# " + line for line in _text(cell).splitlines()] + [""]
            continue
        parts += [f"# In[{number}]:", "", ""]
        parts += [_magic_as(line, "nbconvert") for line in _text(cell).splitlines()] + ["", ""]
    return "\n".join(parts) + "\n"


def jupytext_percent() -> str:
    parts = ["# ---", "# jupyter:", "#   jupytext:", "#     text_representation:",
             "#       format_name: percent", "# ---", ""]
    for cell in _cells():
        if cell["cell_type"] == "markdown":
            parts += ["# %% [markdown]"] + ["# " + line for line in _text(cell).splitlines()]
        else:
            parts += ["# %%"] + [_magic_as(line, "jupytext") for line in
                                 _text(cell).splitlines()]
        parts.append("")
    return "\n".join(parts) + "\n"


def jupytext_light() -> str:
    parts = ["# ---", "# jupyter:", "#   jupytext:", "#     text_representation:",
             "#       format_name: light", "# ---", ""]
    for cell in _cells():
        if cell["cell_type"] == "markdown":
            parts += ["# " + line for line in _text(cell).splitlines()]
        else:
            parts += ["# +"] + [_magic_as(line, "jupytext") for line in
                                _text(cell).splitlines()] + ["# -"]
        parts.append("")
    return "\n".join(parts) + "\n"


WRITTEN = {
    "nbformat-4.0": ("LAB07_MoCo.ipynb", nbformat_4_0),
    "nbformat-4.5": ("LAB07_MoCo.ipynb", nbformat_4_5),
    "colab": ("LAB07_MoCo (1).ipynb", colab_export),
    "nbconvert-script": ("LAB07_MoCo.py", nbconvert_script),
    "jupytext-percent": ("lab07_moco.py", jupytext_percent),
    "jupytext-light": ("lab07_moco.py", jupytext_light),
    "chinese-name": ("实验07_张三_MoCo.ipynb", nbformat_4_5),
    "accented-name": ("LAB07_José_Müller.py", jupytext_percent),
}


@pytest.mark.parametrize("tool", sorted(WRITTEN))
def test_each_tool_s_file_defines_the_lab(tmp_path, tool):
    name, write = WRITTEN[tool]
    path = tmp_path / name
    path.write_text(write(), encoding="utf-8")
    loaded = load_submission(str(path))
    assert callable(loaded.namespace.get("train_moco")), loaded.notes
    assert callable(loaded.namespace.get("moco_warmup")), loaded.notes


def test_the_writers_differ_as_the_tools_do():
    """The corpus is what it says: each writer gives its tool's marks (so a test above that
    passes is not one file read eight times)."""
    old, new = json.loads(nbformat_4_0()), json.loads(nbformat_4_5())
    assert old["nbformat_minor"] == 0 and all("id" not in c for c in old["cells"])
    assert new["nbformat_minor"] >= 5 and all("id" in c for c in new["cells"])
    colab = json.loads(colab_export())
    assert "widgets" in colab["metadata"] and any(
        o["output_type"] == "error" for c in colab["cells"] for o in c.get("outputs", ()))
    assert "# In[" in nbconvert_script() and "get_ipython().system(" in nbconvert_script()
    assert "# %%" in jupytext_percent() and "# !pip" in jupytext_percent()
    assert "# +" in jupytext_light() and "format_name: light" in jupytext_light()


@pytest.mark.full
@pytest.mark.parametrize("tool", ["colab", "nbconvert-script", "chinese-name"])
def test_graded_whole_in_the_sandbox_each_reaches_full_marks(tmp_path, tool):
    from moco_ref.probe.options import GradeOptions
    from moco_ref.run.pipeline import grade_submission

    name, write = WRITTEN[tool]
    path = tmp_path / name
    path.write_text(write(), encoding="utf-8")
    report = grade_submission(str(path), GradeOptions())
    assert report.gradable, report.traceback
    assert report.score == report.max_score, [
        (r.check_id, r.message) for r in report.results if r.points < r.max_points]
    assert Path(report.submission).name == name
