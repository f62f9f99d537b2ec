"""A feedback page and the class report rendered in headless Chromium (``tox -e browser``):
the screenshot is a non-empty PNG. Deselected by default (marker ``browser``); skipped when
no Chromium is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from moco_ref.cli import main

pytestmark = pytest.mark.browser
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "submissions"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(f"no headless Chromium installed (looked for {', '.join(BROWSERS)})")


def _screenshot(browser: str, page: Path, shot: Path) -> None:
    subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox",
                    "--no-first-run", "--window-size=1000,1400", f"--screenshot={shot}",
                    page.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 5000, f"{shot.name}: {len(data)} bytes"


def test_a_feedback_page_and_the_class_report_render_in_chromium(tmp_path):
    browser = _chromium()
    folder, out = tmp_path / "class", tmp_path / "out"
    folder.mkdir()
    for name in ("correct_lab_order.py", "bug_no_mask.py"):
        shutil.copy(EXAMPLES / name, folder / name)
    main(["grade", str(folder), "--out", str(out), "--feedback", "html", "-j", "2"])
    assert main(["class-report", str(out), "--html", str(tmp_path / "class.html")]) == 0
    _screenshot(browser, out / "bug_no_mask.py.feedback.html", tmp_path / "feedback.png")
    _screenshot(browser, tmp_path / "class.html", tmp_path / "class.png")
