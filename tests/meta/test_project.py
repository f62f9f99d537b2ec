"""The landing: the README's test command is the one CI runs, and the core imports
without torchvision."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_exactly_two_commands():
    head = (ROOT / "README.md").read_text().split("## ")[0]
    assert len(re.findall(r"```bash\n(.+?)\n```", head)) == 2


def test_ci_runs_the_readme_test_command():
    assert _readme_commands()[1] in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow  # the default run has its superset: tests/tools/test_data_views.py
def test_core_imports_without_torchvision():
    code = (
        "import sys; sys.modules['torchvision'] = None\n"
        "import moco_ref; moco_ref.moco_warmup()\n"
        "assert 'torchvision' not in [m for m in sys.modules if sys.modules[m]]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_layers_hold_as_declared():
    """pyproject's import-linter contracts: the layers, an observing side that imports
    nothing of the reference or the judge, a judge that never imports the observing side, and
    a contract (``probe``) that imports nothing else of moco_ref."""
    command = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(command)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 5 kept, 0 broken." in done.stdout


def test_the_observing_side_loads_neither_the_reference_nor_the_judge():
    """What runs beside a submission (the worker and everything it preloads) leaves the
    reference and the judge unloaded, so a submission cannot reach them in ``sys.modules``."""
    script = ("import sys, moco_ref.observe.worker\n"
              "print(sorted(m for m in sys.modules if m.startswith('moco_ref.')"
              " and not m.startswith(('moco_ref.observe', 'moco_ref.probe'))))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.full  # the second tier: observes three examples in a fresh interpreter
def test_the_grader_imports_all_it_judges_with_before_any_submission_runs():
    """After ``import moco_ref.run.pipeline``, validating and judging a submission's record imports
    no further moco_ref module: nothing loaded after a submission ran is grader code."""
    script = """
import sys
from pathlib import Path
import moco_ref.run.pipeline
from moco_ref.probe.options import GradeOptions
from moco_ref.observe.loader import load_submission
from moco_ref.observe.parts import observe_part
from moco_ref.probe.parts import part_names
from moco_ref.probe.styles import detect_style
namespaces = []
for name in ("correct_lab_order.py", "components_correct_with_warmup.py",
             "builder_correct_official_style.py"):
    namespaces.append(load_submission(str(Path("examples/submissions") / name)).namespace)
parts = []
for namespace in namespaces:
    style = detect_style(namespace)
    for part in part_names(style):
        parts.append((style, part, *observe_part(namespace, style, part, GradeOptions())))
before = set(sys.modules)
from moco_ref.judge.judge import judge
from moco_ref.judge.styles import validate_part
for style, part, data, meta in parts:
    assert validate_part(style, part, data, meta, GradeOptions()) == "", (style, part)
    judge({part: data, **meta, "style": style}, style, GradeOptions())
print(sorted(m for m in set(sys.modules) - before if m.startswith("moco_ref")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
