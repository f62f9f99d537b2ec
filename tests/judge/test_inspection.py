"""Code that inspects the grader's world is named to staff, with its line, and never shown to
the student: gates on the input's size or pixel statistics, on the type or module of what is
handed over, on the environment or the host; no bundled example (correct or buggy) is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moco_ref import selfcheck
from moco_ref.judge.inspection import inspection_notes
from moco_ref.judge.results import CheckResult, Status, SubmissionReport
from moco_ref.judge.rubric import DEFAULT_RUBRIC
from moco_ref.platforms.gradescope.writer import gradescope_results
from moco_ref.platforms.prairielearn.writer import prairielearn_results
from moco_ref.report import feedback
from moco_ref.report.formats import header_lines

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "submissions"
GATES = {
    "size": ("def train_moco(views, initial, *a):\n"
             "    if len(views.images) > 4000:\n        return honest()\n", 2),
    "pixels": ("def train_moco(views, initial, *a):\n"
               "    if views.images.max() < 1.5:\n        return honest()\n", 2),
    "type module": ("def train_moco(views, initial, *a):\n    grader = "
                    "type(initial).__module__.startswith('moco')\n", 2),
    "class name": ("def train_moco(views, initial, *a):\n"
                   "    x = 1\n    if type(initial).__name__ != 'Sequential':\n        x = 2\n",
                   3),
    "views module": "def train_moco(views, *a):\n    return views.__module__\n",
    "environment": "import os\n\nGRADED = 'MOCO' in ''.join(os.environ)\n",
    "host": "import socket\n\nHOST = socket.gethostname()\n",
    "builder K": ("class MoCo:\n    def __init__(self, K=65536, dim=128):\n"
                  "        self.ema = K >= 4096 and self.queue.size(0) > 4096\n"
                  "        if self.queue.size(0) < 4096:\n            pass\n", 4),
}


@pytest.mark.parametrize("gate", list(GATES))
def test_each_gate_is_named_with_its_line(tmp_path, gate):
    source, line = GATES[gate] if isinstance(GATES[gate], tuple) else (GATES[gate], None)
    path = tmp_path / "gate.py"
    path.write_text(source)
    notes = inspection_notes(path)
    assert notes, gate
    if line is not None:
        assert any(note.startswith(f"line {line}: ") for note in notes), notes


def test_no_bundled_example_is_named():
    named = {p.name: inspection_notes(p) for p in sorted(EXAMPLES.iterdir())
             if p.suffix in (".py", ".ipynb")}
    assert len(named) >= 150
    assert {name: notes for name, notes in named.items() if notes} == {}


def test_the_staff_see_it_and_the_student_never_does():
    note = "line 2: reads the size or the statistics of its input in a branch (`if x`)"
    report = SubmissionReport("alice.py", "lab", True, [CheckResult(
        "I3-fifo-keeps-newest", "fifo", "I3", 10.0, Status.PASSED, "ok")], staff_notes=[note])
    assert any(note in line for line in header_lines(report))  # the staff's terminal
    assert SubmissionReport.from_dict(report.to_dict()).staff_notes == [note]
    shown = [json.dumps(gradescope_results(report)), json.dumps(prairielearn_results(
        report)), feedback.feedback_html(report, draw=False),
        feedback.feedback_markdown(report, draw=False),
        repr(selfcheck.student_view(report, DEFAULT_RUBRIC))]
    assert not any("reads the size" in text for text in shown)
