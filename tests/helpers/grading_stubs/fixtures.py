"""Fixtures that swap the stand-in harness in, here and in every child process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.grading_stubs import stub_harness

STUBS_DIR = Path(__file__).resolve().parent


def _swap_in(patch: pytest.MonkeyPatch) -> None:
    for name, module in stub_harness.install(modules={}).items():
        patch.setitem(sys.modules, name, module)
    # the grade imported its judge before any submission ran: replace it there too
    patch.setattr("moco_ref.run.pipeline.judge", stub_harness.judge)
    existing = os.environ.get("PYTHONPATH", "")
    patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(STUBS_DIR), existing) if p))
    # the stand-in reaches the submission's process through PYTHONPATH, which the bwrap
    # sandbox clears (and whose folder it does not hold): the runner's logic is tested with
    # processes; the sandbox itself with the real harness (test_grading_adversarial,
    # test_doctor)
    from moco_ref.sandbox.client import ISOLATION_VARIABLE

    patch.setenv(ISOLATION_VARIABLE, "processes")


@pytest.fixture
def stubbed(monkeypatch):
    """The stand-in observe/judge/registry for one test (and the processes it starts)."""
    _swap_in(monkeypatch)


GOOD_WARMUP = '''
def moco_warmup():
    return {"temperature_probabilities": {"0.1": [1.0, 0.0, 0.0]},
            "FIFO": ["c", "d", "e", "f"], "EMA": [0.2, 2.2]}
'''

BAD_FIFO_WARMUP = '''
def moco_warmup():
    return {"temperature_probabilities": {}, "FIFO": ["a", "b", "c", "d"], "EMA": [0.2, 2.2]}
'''


def write(folder: Path, name: str, source: str) -> str:
    path = folder / name
    path.write_text(source)
    return str(path)
