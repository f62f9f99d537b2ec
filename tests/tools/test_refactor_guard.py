"""The refactor guard: it finds a one-ulp change in one key of one step, names the step and
the quantity, and ignores a storage-only refactor."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from moco_ref.cli import main
from moco_ref.observe.observers import observe
from moco_ref.probe.options import GradeOptions
from moco_ref.tools import refactor_guard
from tests.helpers.conformance_support import load_namespace

pytestmark = pytest.mark.full  # the second tier: each recording runs the sandbox


PAIR = Path(__file__).resolve().parents[1] / "helpers" / "refactor_pair"


@pytest.fixture(scope="module")
def recorded():
    out = {}
    for name in ("lab_concat", "lab_ring", "lab_paper_lerp", "lab_mask_dropped_when_full"):
        observations = observe(load_namespace(PAIR / f"{name}.py"), "lab", GradeOptions())
        out[name] = refactor_guard.trajectory_from_observations(observations, "lab", name)
    return out


def test_a_trajectory_is_identical_to_itself(recorded):
    assert refactor_guard.compare(recorded["lab_concat"], recorded["lab_concat"]) is None


def test_a_storage_only_refactor_is_identical(recorded):
    """Concatenate-and-slice against a ring buffer read oldest first: bitwise the same run."""
    assert len(recorded["lab_ring"]["steps"]) >= 6
    assert refactor_guard.compare(recorded["lab_concat"], recorded["lab_ring"]) is None


def test_one_ulp_in_one_key_of_one_step_is_found(recorded):
    changed = copy.deepcopy(recorded["lab_ring"])
    row = changed["steps"][4]["k"][2]
    row[5] = float(np.nextafter(np.float32(row[5]), np.float32(np.inf)))
    divergence = refactor_guard.compare(recorded["lab_concat"], changed)
    assert divergence is not None
    assert divergence.where.startswith("step 4 (epoch") and divergence.where.endswith(": k")
    assert "1 of" in divergence.detail and "at index [2, 5]" in divergence.detail
    assert refactor_guard.compare(recorded["lab_concat"], changed, rtol=1e-6) is None


def test_the_first_divergence_wins_over_later_ones(recorded):
    changed = copy.deepcopy(recorded["lab_concat"])
    changed["steps"][2]["loss"] += 1e-3
    changed["steps"][5]["ids"][0] += 1
    divergence = refactor_guard.compare(recorded["lab_concat"], changed)
    assert divergence.where.startswith("step 2 ") and divergence.where.endswith(": loss")


def test_the_reference_loss_is_recorded_per_step(recorded):
    losses = [step["loss"] for step in recorded["lab_concat"]["steps"]]
    assert all(isinstance(loss, float) and loss > 0 for loss in losses)


def test_compare_command_exit_codes(recorded, tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    refactor_guard.save(recorded["lab_concat"], a)
    refactor_guard.save(recorded["lab_ring"], b)
    assert main(["compare", str(a), str(b)]) == 0
    assert "identical: bitwise" in capsys.readouterr().out
    changed = refactor_guard.load(b)  # gzip-compressed JSON
    changed["final"]["queue_ids"][0] += 1
    b.write_text(json.dumps(changed))
    assert main(["compare", str(a), str(b)]) == 1
    assert "behaviour change at the end of training in queue_ids" in capsys.readouterr().out
    assert main(["compare", str(a), str(b), "--bitwise"]) == 1
    assert "first divergence at the end of training: queue_ids" in capsys.readouterr().out
    b.write_text("{}")
    assert main(["compare", str(a), str(b)]) == 2


def test_record_command_runs_the_submission_in_the_sandbox(tmp_path, recorded, capsys):
    out = tmp_path / "run.json"
    assert main(["record", str(PAIR / "lab_concat.py"), "--out", str(out)]) == 0
    assert "steps) to" in capsys.readouterr().out
    assert refactor_guard.compare(recorded["lab_concat"], refactor_guard.load(out)) is None


def test_a_rounding_only_refactor_is_equivalent_up_to_rounding(recorded, tmp_path, capsys):
    """Storage, step order (paper) and the EMA's written form (lerp_) changed: the runs part
    by float rounding from step 0, yet every step follows the same MoCo transition."""
    a, b = recorded["lab_concat"], recorded["lab_paper_lerp"]
    assert refactor_guard.compare(a, b) is not None  # not bitwise the same
    verdict = refactor_guard.classify(a, b)
    assert verdict.kind == "rounding" and len(verdict.growth) == len(a["steps"])
    assert max(verdict.growth) < 1e-2
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, trajectory in zip(paths, (a, b)):
        refactor_guard.save(trajectory, path)
    assert main(["compare", *map(str, paths)]) == 0
    assert "equivalent up to rounding" in capsys.readouterr().out
    assert main(["compare", *map(str, paths), "--bitwise"]) == 1


def test_a_one_line_behaviour_change_is_named_at_its_step(recorded):
    """The mask dropped once the queue is full: a behaviour change in the loss at the first
    step it shows (a full queue holding a same-source key), naming both laws."""
    verdict = refactor_guard.classify(recorded["lab_concat"],
                                      recorded["lab_mask_dropped_when_full"])
    assert verdict.kind == "behaviour"
    assert verdict.where.startswith("step 5 ") and "in the loss" in verdict.where
    assert "A: the reference loss; B: no same-source mask" in verdict.detail


def test_compare_plot_draws_the_divergence(recorded, tmp_path, capsys):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, name in zip(paths, ("lab_concat", "lab_mask_dropped_when_full")):
        refactor_guard.save(recorded[name], path)
    figure = tmp_path / "divergence.png"
    assert main(["compare", *map(str, paths), "--plot", str(figure)]) == 1
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 5000
    from moco_ref.tools.divergence_figure import step_gaps

    gaps = step_gaps(recorded["lab_concat"], recorded["lab_mask_dropped_when_full"])
    assert gaps["grad"][0] == 0.0 and gaps["grad"][5] > 1e-3  # equal until the change


def test_a_saved_trajectory_is_small_and_exact(recorded, tmp_path):
    path = tmp_path / "run.json"
    refactor_guard.save(recorded["lab_concat"], path)
    plain = len(json.dumps(recorded["lab_concat"]).encode())
    assert path.stat().st_size < plain / 2  # compressed
    assert refactor_guard.compare(refactor_guard.load(path), recorded["lab_concat"]) is None
    old_style = tmp_path / "old.json"
    old_style.write_text(json.dumps(recorded["lab_concat"]))  # plain JSON still loads
    assert refactor_guard.load(old_style)["steps"] == recorded["lab_concat"]["steps"]


# --------------------------------------------------------------------------- builder modules

OFFICIAL = PAIR.parents[2] / "examples" / "submissions" / "builder_correct_official_style.py"


@pytest.fixture(scope="module")
def builder_recorded():
    out = {}
    for name, path in (("official", OFFICIAL),
                       ("refactored", PAIR / "builder_refactored.py"),
                       ("ema_skipped", PAIR / "builder_ema_skipped_after_wrap.py")):
        observations = observe(load_namespace(path), "builder", GradeOptions())
        out[name] = refactor_guard.trajectory_from_observations(observations, "builder", name)
    return out


def test_a_builder_run_is_recorded_step_by_step_with_its_laws(builder_recorded):
    run = builder_recorded["official"]
    assert len(run["steps"]) == 10 and len(run["laws"]["steps"]) == 10
    first = run["steps"][0]
    assert len(first["q"]) == 8 and len(first["logits"][0]) == 49 and len(first["queue"]) == 48
    assert {s["loss"] for s in run["laws"]["steps"]} == {
        "the reference logits [q·k⁺, q·queue]/T"}
    assert run["laws"]["rules"]["K"] == 48 and run["laws"]["failed_checks"] == []


def test_a_refactored_module_is_equivalent_up_to_rounding(builder_recorded, tmp_path, capsys):
    """lerp_ EMA, index_copy_ ring, state_dict copy, row-wise positives: not bitwise the
    official module's run, yet the same transition at every step."""
    a, b = builder_recorded["official"], builder_recorded["refactored"]
    divergence = refactor_guard.compare(a, b)
    assert divergence is not None and divergence.where.startswith("step 0: ")
    verdict = refactor_guard.classify(a, b)
    assert verdict.kind == "rounding", verdict
    assert max(verdict.growth) < 1e-2
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, trajectory in zip(paths, (a, b)):
        refactor_guard.save(trajectory, path)
    assert main(["compare", *map(str, paths)]) == 0
    assert "equivalent up to rounding" in capsys.readouterr().out
    assert main(["compare", *map(str, paths), "--bitwise"]) == 1


def test_every_run_the_grader_makes_is_recorded_and_compared(builder_recorded, tmp_path):
    """The mlp, K-not-a-multiple and two-process runs are in a module's recording; a revision
    that wraps in mid-batch where the official refuses (its assert) differs there alone, and
    is named at that run with the official's refusal in its own terms."""
    official = builder_recorded["official"]
    assert set(official["runs"]) == {"mlp", "ragged", "rank 0", "rank 1"}
    refusal = official["runs"]["ragged"]["crash"]
    assert refusal["exception"] == "AssertionError" and refusal["stage"] == "step 0"
    assert "_dequeue_and_enqueue" in refusal["frame"]
    text = (PAIR / "builder_refactored.py").read_text()
    wrapping = tmp_path / "builder_wraps.py"
    wrapping.write_text(text.replace("        assert self.K % len(keys) == 0", "", 1))
    observations = observe(load_namespace(wrapping), "builder", GradeOptions())
    changed = refactor_guard.trajectory_from_observations(observations, "builder", "wraps")
    verdict = refactor_guard.classify(builder_recorded["refactored"], changed)
    assert verdict.kind == "behaviour", verdict
    assert verdict.where == "the run with K not a multiple of the batch, step 0", verdict
    assert "A: the run with K not a multiple of the batch raised at step 0: AssertionError" \
        in verdict.detail and "B: ran to the end" in verdict.detail


def test_a_skipped_ema_after_the_wrap_is_a_behaviour_change_at_its_step(builder_recorded):
    """The EMA skipped every other step once the queue has wrapped (step 7 is the first
    skip: 8 steps · 8 keys > K = 48 and the step count is even)."""
    verdict = refactor_guard.classify(builder_recorded["refactored"],
                                      builder_recorded["ema_skipped"])
    assert verdict.kind == "behaviour"
    assert verdict.where == "step 7 in the key encoder's update"
    assert verdict.detail == "A: law; B: off the EMA law"
    from moco_ref.tools.divergence_figure import step_gaps

    gaps = step_gaps(builder_recorded["refactored"], builder_recorded["ema_skipped"])
    assert gaps["key_params"][6] == 0.0 and gaps["key_params"][8] > 0.0
