"""Notebooks as editors save them: a UTF-8 byte-order mark (Windows tools), UTF-16, CRLF line
endings are read; a file that truly is not a notebook names its cause (truncated JSON, not
JSON, an encoding that does not match its mark)."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from moco_ref.observe.loader import load_submission
from moco_ref.probe.styles import NotASubmission

NOTEBOOK = (Path(__file__).resolve().parents[2] / "examples" / "submissions"
            / "correct_notebook.ipynb")


def _defines_the_lab(loaded) -> bool:
    return callable(loaded.namespace.get("train_moco")) and callable(
        loaded.namespace.get("moco_warmup"))


@pytest.mark.parametrize("encode", [
    pytest.param(lambda text: codecs.BOM_UTF8 + text.encode("utf-8"), id="utf-8 with a BOM"),
    pytest.param(lambda text: text.encode("utf-16"), id="utf-16 (BOM)"),
    pytest.param(lambda text: text.replace("\n", "\r\n").encode("utf-8"), id="CRLF"),
    pytest.param(lambda text: codecs.BOM_UTF8 + text.replace("\n", "\r\n").encode("utf-8"),
                 id="BOM and CRLF"),
])
def test_a_notebook_saved_by_another_tool_is_read(tmp_path, encode):
    path = tmp_path / "LAB07.ipynb"
    path.write_bytes(encode(NOTEBOOK.read_text(encoding="utf-8")))
    assert _defines_the_lab(load_submission(str(path)))


@pytest.mark.parametrize(("data", "cause"), [
    (NOTEBOOK.read_bytes()[: len(NOTEBOOK.read_bytes()) // 2], "truncated"),
    (b"PK\x03\x04 a zip renamed .ipynb", "not JSON"),
    (b"", "empty"),
    (codecs.BOM_UTF8 + b"\xff\xfe{}", "byte-order mark"),
    (b"{\"cells\": [}", "invalid JSON at line 1"),
])
def test_a_file_that_is_not_a_notebook_names_its_cause(tmp_path, data, cause):
    path = tmp_path / "LAB07.ipynb"
    path.write_bytes(data)
    with pytest.raises(NotASubmission, match=cause) as raised:
        load_submission(str(path))
    assert "LAB07.ipynb is not a readable notebook" in str(raised.value) or "empty" in str(
        raised.value)
