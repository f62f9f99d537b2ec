"""The refactor guard on a user's own training script (``examples/training``): recorded
unchanged, in this process, at several revisions of a git repository, and compared: a pure
refactor is identical or rounding, a behaviour change is named at its first step with its law,
a different starting state is told apart from both, a crash is told in the user's terms."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moco_ref.tools import refactor_guard
from moco_ref.trace.script import PartPaths, record_script
from moco_ref.trace.trajectory import trajectory_of

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "training"
PATHS = PartPaths(query=["encoder_q"], key=["encoder_k"], queue="queue", pointer="queue_ptr",
                  views="forward", temperature=0.2, momentum=0.99)
ATTACH = "moco_model:MoCoModel"
COMMAND = ["train_moco.py", "--epochs", "1"]

# each revision: (file, old text, new text) applied to the example
REFACTOR = ("moco_model.py",
            '        positives = torch.einsum("nc,nc->n", q, k).unsqueeze(1)  # [B, 1]',
            "        positives = (q * k).sum(dim=1, keepdim=True)  # [B, 1]")
ENQUEUE_FIRST = [("moco_model.py",
                  "        negatives = q @ self.queue.clone().detach()  # [B, K]",
                  "        self.enqueue(k)\n"
                  "        negatives = q @ self.queue.clone().detach()  # [B, K]"),
                 ("moco_model.py", "        self.enqueue(k)\n        return logits, labels",
                  "        return logits, labels")]
SECOND_DRAW = ("moco_model.py",
               '        self.register_buffer("queue", F.normalize(torch.randn(dim, queue_size), '
               'dim=0))',
               '        torch.randn(dim, queue_size)  # a draw the new revision makes first\n'
               '        self.register_buffer("queue", F.normalize(torch.randn(dim, queue_size), '
               'dim=0))')
CRASH = ("moco_model.py", "        start = int(self.queue_ptr)",
         "        start = int(self.queue_ptr)\n"
         "        assert start + len(keys) < self.queue.shape[1], 'queue full'")


def _revision(folder: Path, *changes) -> Path:
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name, old, new in changes:
        text = (folder / name).read_text()
        assert old in text, f"{name} no longer holds {old!r}"
        (folder / name).write_text(text.replace(old, new, 1))
    return folder


def _trajectory(folder: Path, monkeypatch) -> dict:
    monkeypatch.chdir(folder)
    run = record_script(COMMAND, ATTACH, PATHS, steps=6)
    return trajectory_of(run.recording, "train_moco.py", error=run.error)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    out = {}
    try:
        for name, changes in (("base", ()), ("again", ()), ("refactor", (REFACTOR,)),
                              ("enqueue_first", ENQUEUE_FIRST),
                              ("second_draw", (SECOND_DRAW,)), ("crash", (CRASH,))):
            folder = _revision(tmp_path_factory.mktemp(name) / "repo", *changes)
            out[name] = _trajectory(folder, monkeypatch)
    finally:
        monkeypatch.undo()
    return out


def test_the_same_script_twice_is_identical(recorded):
    assert refactor_guard.classify(recorded["base"], recorded["again"]).kind == "identical"
    assert len(recorded["base"]["steps"]) == 6


def test_a_pure_refactor_is_identical_or_rounding(recorded):
    verdict = refactor_guard.classify(recorded["base"], recorded["refactor"])
    assert verdict.kind in ("identical", "rounding"), str(verdict)


def test_enqueueing_before_the_logits_is_a_behaviour_change_at_step_0_named_by_its_law(recorded):
    verdict = refactor_guard.classify(recorded["base"], recorded["enqueue_first"])
    assert verdict.kind == "behaviour", str(verdict)
    assert verdict.where.startswith("step 0"), str(verdict)
    assert "B: the batch's own keys among the negatives" in verdict.detail, str(verdict)


def test_a_second_random_draw_is_a_different_starting_state(recorded):
    verdict = refactor_guard.classify(recorded["base"], recorded["second_draw"])
    assert verdict.kind == "start", str(verdict)
    assert "different queues" in verdict.detail, str(verdict)


def test_a_crash_is_told_in_the_users_terms(recorded):
    verdict = refactor_guard.classify(recorded["base"], recorded["crash"])
    assert verdict.kind == "behaviour", str(verdict)
    text = str(verdict)
    assert "AssertionError: queue full" in text and "in enqueue (moco_model.py)" in text, text
    assert "/moco_ref/" not in text


def test_revisions_compares_two_commits_in_one_command(tmp_path):
    """``moco-ref revisions A B -- trace record …``: worktrees at both commits, the same
    command in each, the verdict and its exit code (1: a behaviour change)."""
    repo = _revision(tmp_path / "repo")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    for name, old, new in ENQUEUE_FIRST:
        (repo / name).write_text((repo / name).read_text().replace(old, new, 1))
    subprocess.run([*git, "commit", "-qam", "enqueue first"], check=True)
    done = subprocess.run(
        [sys.executable, "-m", "moco_ref.cli", "revisions", "HEAD~1", "HEAD", "--repo",
         str(repo), "--", "trace", "record", "--attach", ATTACH, "--query", "encoder_q",
         "--key", "encoder_k", "--queue", "queue", "--pointer", "queue_ptr", "--views",
         "forward", "--temperature", "0.2", "--momentum", "0.99", "--steps", "3", "--",
         *COMMAND], capture_output=True, text=True, timeout=600, cwd=repo)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "behaviour change at step 0" in done.stdout, done.stdout
    listed = subprocess.run([*git, "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1  # the worktrees are gone
