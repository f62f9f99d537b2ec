"""The documentation: the README is the front page only (under 10 KB: what moco-ref is, the
two commands, the three uses, links), every link it gives resolves, and the pages build as a
site with no warning (mkdocs in strict mode)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_is_a_front_page_under_10_kb():
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) < 10_000, len(readme)
    assert b"## Three uses" in readme and b"## Documentation" in readme


def test_every_file_the_readme_links_exists():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
               if not t.startswith(("http://", "https://", "#"))]
    assert targets, "the README links its pages"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []


def test_the_documentation_builds_without_a_warning(tmp_path):
    pytest.importorskip("mkdocs")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "site" / "invariants" / "index.html").exists()
