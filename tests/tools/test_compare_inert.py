"""``moco-ref compare`` reads files anyone may have written: a gzip bomb is refused under a
byte cap while it is decompressed (never after), in one line with the usage exit code, and
what the files say is printed inert."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
import zlib

import pytest

from moco_ref.cli import main
from moco_ref.tools import refactor_guard, trajectory_file

SMALL_CAP = 1 << 20  # the test's cap: the bomb is refused after reading just over 1 MB


def _bomb(path, megabytes: int = 300) -> None:
    """``{"a": "xxx…"}`` of ``megabytes`` MB, gzip-compressed (about 0.3 MB), written as a
    stream so the test itself never holds the 300 MB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    block = b"x" * (1 << 20)
    with path.open("wb") as out:
        out.write(packer.compress(b'{"a": "'))
        for _ in range(megabytes):
            out.write(packer.compress(block))
        out.write(packer.compress(b'"}') + packer.flush())


@pytest.fixture
def small_cap(monkeypatch):
    monkeypatch.setattr(trajectory_file, "MAX_TRAJECTORY_BYTES", SMALL_CAP)


def test_the_cap_is_a_named_constant_of_256_mb():
    assert trajectory_file.MAX_TRAJECTORY_BYTES == 256 * 2**20


@pytest.mark.usefixtures("small_cap")
def test_a_gzip_bomb_is_refused_cheaply(tmp_path):
    bomb = tmp_path / "bomb.json"
    _bomb(bomb)
    assert bomb.stat().st_size < 2 * 2**20
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(refactor_guard.TrajectoryTooLarge, match="more than 1 MB"):
            refactor_guard.load(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 5
    assert peak < 16 * SMALL_CAP  # a few chunks, not the 300 MB it expands to


@pytest.mark.usefixtures("small_cap")
def test_plain_json_over_the_cap_is_refused_too_and_under_it_loads(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b'{"a": "' + b"x" * (2 * SMALL_CAP) + b'"}')
    with pytest.raises(ValueError, match="the cap"):
        refactor_guard.load(big)
    small = tmp_path / "small.json"
    small.write_bytes(gzip.compress(json.dumps({"a": "x" * 1000}).encode()))
    assert refactor_guard.load(small) == {"a": "x" * 1000}


@pytest.mark.usefixtures("small_cap")
def test_compare_refuses_a_bomb_in_one_line_with_exit_2(tmp_path, capsys):
    bomb = tmp_path / "bomb.json"
    _bomb(bomb, megabytes=8)
    assert main(["compare", str(bomb), str(bomb)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("moco-ref: error: ")
    assert "MB" in lines[0] and "refused" in lines[0]
    assert captured.out == ""


def test_a_corrupt_gzip_file_is_one_line_too(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_bytes(gzip.compress(b'{"format": 1}')[:-12] + b"\xff" * 12)
    assert main(["compare", str(broken), str(broken)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("moco-ref: error: ")


def test_what_the_files_say_is_printed_inert(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"format": refactor_guard.FORMAT, "style": "lab"}))
    b.write_text(json.dumps({"format": refactor_guard.FORMAT,
                             "style": "\x1b]0;pwned\x07\x1b[2J\r\nall checks pass\x1b[0m"}))
    for extra in ([], ["--bitwise"]):
        assert main(["compare", str(a), str(b), *extra]) == 1
        out = capsys.readouterr().out
        assert "the style" in out
        for bad in ("\x1b", "\r", "\x07", "pwned"):
            assert bad not in out, (bad, out)
        assert out.count("\n") == 1  # one line: the file's newline starts none
