"""One rule decides which entry points a file binds (``moco_ref.probe.source``): any top-level
binding — def, class, assignment, import — read from the source without running it."""

from __future__ import annotations

import nbformat
import pytest

from moco_ref.probe.source import bound_entry_points, may_be_helper, style_from_source


@pytest.mark.parametrize(("source", "expected"), [
    ("def train_moco(*a):\n    pass\n", {"train_moco"}),
    ("class MoCo:\n    pass\n", {"MoCo"}),
    ("def _impl(*a):\n    pass\ntrain_moco = _impl\n", {"train_moco"}),
    ("from impl import run as train_moco, moco_warmup\n", {"train_moco", "moco_warmup"}),
    ("import impl as MoCo\n", {"MoCo"}),
    ("KeyQueue: type = object\n", {"KeyQueue"}),
    ("train_moco, moco_warmup = 1, 2\n", {"train_moco", "moco_warmup"}),
    ("def helper():\n    train_moco = 1\n", set()),  # not at top level
    ("if False:\n    def train_moco():\n        pass\n", set()),  # may not run
    ("x = 1\n", set()),
    ("def moco_warmup():\n    return {}\n", {"moco_warmup"}),  # a shared warm-up: a helper
])
def test_every_kind_of_top_level_binding_counts(tmp_path, source, expected):
    path = tmp_path / "s.py"
    path.write_text(source)
    assert bound_entry_points(path) == expected
    assert may_be_helper(path) is (not expected - {"moco_warmup"})


def test_a_file_that_does_not_parse_is_never_a_helper(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def (:\n")
    assert bound_entry_points(path) == set()
    assert not may_be_helper(path)


def test_a_notebook_is_read_cell_by_cell_past_its_magics(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("%matplotlib inline\nimport torch"),
                      nbformat.v4.new_code_cell("%%time\ndef moco_warmup():\n    return {}"),
                      nbformat.v4.new_code_cell("def (broken"),
                      nbformat.v4.new_code_cell("class MoCo:\n    pass")]
    path = tmp_path / "n.ipynb"
    nbformat.write(notebook, str(path))
    assert bound_entry_points(path) == {"moco_warmup", "MoCo"}


@pytest.mark.parametrize(("source", "style"), [
    ("def train_moco(): pass\nclass MoCo: pass\n", "lab"),
    ("class MoCo: pass\ndef moco_warmup(): pass\n", "builder"),
    ("def info_nce_loss(): pass\n", "components"),
    ("def moco_warmup(): pass\n", "lab"),
    ("x = 1\n", None),
])
def test_the_style_from_source_follows_the_style_table(tmp_path, source, style):
    path = tmp_path / "s.py"
    path.write_text(source)
    assert style_from_source(path) == style
