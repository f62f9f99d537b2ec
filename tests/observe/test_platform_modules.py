"""A notebook written on Colab or in Jupyter imports its platform's modules (``google.colab``,
``IPython.display``, ``tqdm.notebook``); the grader's process has none of them, and nothing
graded needs them. The import alone never makes a notebook ungradable, the report says what
was stubbed, and a call into Colab inside ``train_moco`` fails naming why."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

from moco_ref.observe import platform_stubs
from moco_ref.observe.loader import load_submission

NOTEBOOK = (Path(__file__).resolve().parents[2] / "examples" / "submissions"
            / "correct_notebook.ipynb")
COLAB_CELL = """\
from google.colab import drive, files
from google.colab import output
drive.mount('/content/drive')
output.enable_custom_widget_manager()
"""
SAVE_CELL = "torch.save({'done': True}, '/content/drive/MyDrive/moco.pt')\nfiles.download('x')"


def _colab_notebook(tmp_path, *cells: str) -> Path:
    notebook = nbformat.read(str(NOTEBOOK), as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(cells[0]))
    for source in cells[1:]:
        notebook.cells.append(nbformat.v4.new_code_cell(source))
    path = tmp_path / "LAB07_MoCo.ipynb"
    nbformat.write(notebook, str(path))
    return path


def test_a_colab_notebook_that_mounts_drive_is_gradable_and_says_so(tmp_path):
    loaded = load_submission(str(_colab_notebook(tmp_path, COLAB_CELL, SAVE_CELL)))
    assert callable(loaded.namespace["train_moco"]) and callable(loaded.namespace["moco_warmup"])
    notes = " ".join(loaded.notes)
    assert "google.colab is Colab's own" in notes and "stubbed" in notes
    assert "drive.mount" in notes  # the top-level call itself was skipped, and said


def test_colab_inside_train_moco_fails_naming_why(tmp_path):
    cell = COLAB_CELL.splitlines()[0] + "\ndef mount_and_train():\n    drive.mount('/x')\n"
    loaded = load_submission(str(_colab_notebook(tmp_path, cell)))
    with pytest.raises(platform_stubs.PlatformOnly, match=r"google\.colab\.drive\.mount\(\) is "
                       "Colab's own.*outside train_moco"):
        loaded.namespace["mount_and_train"]()


def test_the_usual_am_i_on_colab_test_still_says_no(tmp_path):
    """A guarded import is left alone: it raises, and the notebook takes its own branch."""
    guarded = ("try:\n    import google.colab\n    IN_COLAB = True\nexcept ImportError:\n"
               "    IN_COLAB = False\n")
    loaded = load_submission(str(_colab_notebook(tmp_path, guarded)))
    assert loaded.namespace["IN_COLAB"] is False
    assert "google" not in sys.modules or not hasattr(sys.modules["google"], "colab")


def test_what_a_submission_sees_of_a_stub_names_colab_not_the_grader(tmp_path):
    loaded = load_submission(str(_colab_notebook(tmp_path, COLAB_CELL)))
    drive = loaded.namespace["drive"]
    assert type(drive).__module__ == "google.colab" and "moco_ref" not in repr(drive)


def test_a_real_module_always_wins_and_unknown_google_modules_stay_missing():
    platform_stubs.install()
    import json  # noqa: F401 - a real module is found before the stubs are asked

    assert platform_stubs._FINDER.find_spec("json") is None
    assert platform_stubs._FINDER.find_spec("google.protobuf_not_here") is None
    with pytest.raises(ModuleNotFoundError):
        __import__("google.not_colab")


def test_the_notebook_bar_without_widgets_is_the_plain_bar(monkeypatch, capsys):
    monkeypatch.setitem(platform_stubs._MISSING, "ipywidgets", True)
    monkeypatch.delitem(sys.modules, "tqdm.notebook", raising=False)
    platform_stubs.install()
    from tqdm.notebook import tqdm
    from tqdm.std import tqdm as plain

    assert tqdm is plain
    assert list(tqdm(range(3))) == [0, 1, 2]
    monkeypatch.delitem(sys.modules, "tqdm.notebook", raising=False)
