"""The judge stays out of every job wherever moco-ref is installed: the layouts of the images
this project builds (pip under ``/usr/local`` in a python image — PrairieLearn's; Debian's
``/usr/lib/python3/dist-packages``; a venv under ``/opt``; a user site under the home) and a
source checkout. On the confined rung the granted paths never reach the installed moco_ref,
even inside a system folder that is otherwise granted whole, while the packages beside it
(torch) stay readable; on the bwrap rung the installed package is covered, never the
site-packages that holds it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moco_ref.sandbox import bwrap, confined_view

LAYOUTS = {
    "python image (/usr/local)": "usr/local/lib/python3.11/site-packages",
    "debian (/usr/lib)": "usr/lib/python3/dist-packages",
    "venv (/opt)": "opt/venv/lib/python3.11/site-packages",
    "user site (home)": "root/.local/lib/python3.11/site-packages",
}


def _image(root: Path, site_relative: str) -> tuple[Path, Path]:
    """A container's tree: system folders, the site-packages with torch and moco_ref."""
    for folder in ("usr/bin", "usr/lib/x86_64-linux-gnu", "lib", "bin"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    site = root / site_relative
    for name in ("torch", "numpy", "moco_ref/judge", "moco_ref/observe",
                 "moco_ref-0.1.0.dist-info"):
        (site / name).mkdir(parents=True, exist_ok=True)
    return site, site / "moco_ref"


def _granted(monkeypatch, root: Path, site: Path, package: Path) -> list[str]:
    monkeypatch.setattr(confined_view, "system_folders",
                        lambda: [str(root / top) for top in ("usr", "lib", "bin")])
    monkeypatch.setattr(bwrap, "python_folders", lambda: [str(site)])
    monkeypatch.setattr(bwrap, "code_folders", lambda: [])
    monkeypatch.setattr(bwrap, "PACKAGE_DIR", package)
    view = root / "view"
    view.mkdir(exist_ok=True)
    return [path for path, _access in confined_view.rules(str(view), hidden=())]


def _reaches(granted: list[str], path: Path) -> bool:
    """Whether some granted path is ``path`` or holds it."""
    target = os.path.realpath(path)
    return any(target == g or target.startswith(g.rstrip("/") + "/") for g in granted)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_confined_rung_grants_no_path_to_the_installed_judge(tmp_path, monkeypatch,
                                                                  layout):
    site, package = _image(tmp_path, LAYOUTS[layout])
    granted = _granted(monkeypatch, tmp_path, site, package)
    assert not _reaches(granted, package / "judge"), granted
    assert not _reaches(granted, package), granted
    assert _reaches(granted, site / "torch") and _reaches(granted, tmp_path / "usr" / "bin")
    assert bwrap.grader_root() == str(package)  # the package, never its site-packages


def test_a_source_checkout_is_hidden_whole(tmp_path, monkeypatch):
    site, _ = _image(tmp_path, LAYOUTS["python image (/usr/local)"])
    checkout = tmp_path / "usr" / "src" / "moco-ref"
    (checkout / "moco_ref" / "judge").mkdir(parents=True)
    (checkout / "tests").mkdir()
    granted = _granted(monkeypatch, tmp_path, site, checkout / "moco_ref")
    assert bwrap.grader_root() == os.path.realpath(checkout)
    assert not _reaches(granted, checkout / "tests") and not _reaches(granted, checkout)
    assert _reaches(granted, site / "torch")


def test_meta_the_old_rule_would_have_granted_the_judge(tmp_path, monkeypatch):
    """Meta: a rule that grants the system folders whole (the fault this pins) reaches it."""
    site, package = _image(tmp_path, LAYOUTS["python image (/usr/local)"])
    assert _reaches([str(tmp_path / "usr")], package / "judge")
    assert not _reaches(_granted(monkeypatch, tmp_path, site, package), package / "judge")
