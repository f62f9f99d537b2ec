"""The landing: the README's test command is the one CI runs, and the core imports
without torchvision."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_exactly_two_commands():
    head = (ROOT / "README.md").read_text().split("## ")[0]
    assert len(re.findall(r"```bash\n(.+?)\n```", head)) == 2


def test_ci_runs_the_readme_test_command():
    assert _readme_commands()[1] in (ROOT / ".ci" / "run").read_text()


def test_core_imports_without_torchvision():
    code = (
        "import sys; sys.modules['torchvision'] = None\n"
        "import moco_ref; moco_ref.moco_warmup()\n"
        "assert 'torchvision' not in [m for m in sys.modules if sys.modules[m]]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_layers_hold_as_declared():
    """pyproject's import-linter contracts: the layers, and an observing side that imports
    nothing of the reference or the judge."""
    command = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(command)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken." in done.stdout


def test_the_observing_side_loads_neither_the_reference_nor_the_judge():
    """What runs beside a submission (the worker and everything it preloads) leaves the
    reference and the judge unloaded, so a submission cannot reach them in ``sys.modules``."""
    script = ("import sys, moco_ref.observe.worker\n"
              "print(sorted(m for m in sys.modules if m.startswith('moco_ref.')"
              " and not m.startswith('moco_ref.observe')))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
