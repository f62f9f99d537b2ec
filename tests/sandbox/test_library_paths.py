"""A library graded from where its maintainer has it: an editable install (a ``.pth`` folder or
a setuptools finder's mapping, src layout included) or a ``PYTHONPATH`` entry is bound
read-only into the sandbox and importable there, and moco_ref's own checkout never is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moco_ref.sandbox import bwrap

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "builder" / "official_style.py"


def _site(tmp_path: Path, monkeypatch) -> tuple[Path, Path, Path]:
    site = tmp_path / "site-packages"
    site.mkdir()
    pth_src = tmp_path / "flit_lib"
    finder_pkg = tmp_path / "setuptools_lib" / "src" / "mylib"
    for folder in (pth_src, finder_pkg):
        folder.mkdir(parents=True)
    (site / "flit_lib.pth").write_text(f"{pth_src}\nimport sys\n")
    (site / "__editable___mylib_0_1_finder.py").write_text(
        f"import sys\nMAPPING: dict[str, str] = {{'mylib': '{finder_pkg}'}}\n"
        "NAMESPACES = {}\n")
    (site / "moco_ref_checkout.pth").write_text(f"{bwrap.PACKAGE_DIR.parent}\n")
    monkeypatch.setattr(bwrap, "_site_folders", lambda: [str(site)])
    monkeypatch.setattr(bwrap, "python_folders", lambda: [str(site)])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    return site, pth_src, finder_pkg


def test_editable_installs_are_bound_and_moco_refs_checkout_is_not(tmp_path, monkeypatch):
    _, pth_src, finder_pkg = _site(tmp_path, monkeypatch)
    folders = bwrap.code_folders()
    assert sorted(folders) == sorted([str(pth_src.resolve()), str(finder_pkg.resolve())])
    assert str(bwrap.PACKAGE_DIR.parent) not in folders


def test_a_relocated_finder_package_is_imported_from_its_parent(tmp_path, monkeypatch):
    """Below /tmp a folder is bound elsewhere (the job's scratch is /tmp): the sys.path entry
    that reaches it goes on the sandbox's PYTHONPATH, as bound."""
    _, pth_src, finder_pkg = _site(tmp_path, monkeypatch)
    path = bwrap.sandbox_pythonpath("/view").split(os.pathsep)
    assert path[0] == "/view"
    relocated = str(tmp_path).startswith("/tmp")
    expected = {bwrap.seen_as(str(pth_src.resolve())),
                bwrap.seen_as(str(finder_pkg.parent.resolve()))} if relocated else set()
    assert set(path[1:]) == expected
    confined = bwrap.sandbox_pythonpath("/view", relocated=False).split(os.pathsep)
    assert confined == ["/view"]  # the confined rung sees the host's paths: .pth files work


def test_pythonpath_entries_reach_the_sandbox(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{src}{os.pathsep}{bwrap.PACKAGE_DIR.parent}")
    assert bwrap.pythonpath_entries() == [str(src.resolve())]
    assert bwrap.seen_as(str(src.resolve())) in bwrap.sandbox_pythonpath("/view")


@pytest.mark.slow
def test_a_module_importing_a_library_on_pythonpath_is_graded(tmp_path):
    """End to end in the sandbox: the library's MoCo on PYTHONPATH, a file importing it."""
    package = tmp_path / "src" / "mylib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(EXAMPLE, package / "moco.py")
    target = tmp_path / "impl.py"
    target.write_text("from mylib.moco import MoCo\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "src"))
    done = subprocess.run([sys.executable, "-m", "moco_ref.cli", "grade", str(target),
                           "--style", "builder", "--json"],
                          env=env, capture_output=True, text=True, timeout=600)
    import json

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    first = report["reports"][0] if isinstance(report, dict) and "reports" in report else (
        report[0] if isinstance(report, list) else report)
    assert first["gradable"] is True and first["score"] == first["max_score"]
