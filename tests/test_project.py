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
