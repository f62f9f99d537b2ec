"""Goldens hold, none is missing or unused, and each is cross-checked by an independent
route: the closed form for the warm-up, a plain numpy MoCo for the short trajectories."""

import copy
import dataclasses
import json
import shutil

import numpy as np
import pytest

from moco_ref.cli import main
from moco_ref.tools import golden
from tests.core.test_warmup import _closed_form_probabilities


def _stored(name):
    return {k: v["value"] for k, v in
            json.loads(golden.golden_path(golden.DEFAULT_DIR, name).read_text())["values"].items()}


def test_every_golden_holds_and_none_is_missing_or_unused():
    assert golden.check() == []


_PRODUCED: dict[str, dict] = {}


@pytest.fixture
def produced_once(monkeypatch):
    """The producers' values computed once per process: the tests of how a changed, missing or
    unused file is reported compare against the same fresh values as the real check above,
    without rerunning every producer (the digits run above all) for each of them."""
    for name, entry in list(golden.GOLDENS.items()):
        def produce(name=name, real=entry.produce):
            if name not in _PRODUCED:
                _PRODUCED[name] = real()
            return copy.deepcopy(_PRODUCED[name])

        monkeypatch.setitem(golden.GOLDENS, name, dataclasses.replace(entry, produce=produce))


def test_golden_files_record_provenance_and_a_reason():
    for name in golden.GOLDENS:
        document = json.loads(golden.golden_path(golden.DEFAULT_DIR, name).read_text())
        assert {"moco_ref", "torch", "numpy", "dtype", "seed", "platform"} <= set(
            document["provenance"])
        assert document["history"] and document["history"][-1]["reason"].strip()
        assert all({"rtol", "atol"} <= set(v) for v in document["values"].values())


def test_warmup_golden_matches_the_closed_form():
    """Route: closed form of softmax(q·k/T) with q·k = 4/sqrt(17), 0, −1; FIFO and EMA by hand."""
    stored = _stored("warmup")
    for t in ("0.1", "0.5"):
        assert stored[f"temperature_probabilities.{t}"] == pytest.approx(
            _closed_form_probabilities(float(t)), rel=1e-12)
    assert stored["FIFO"] == ["a", "b", "c", "d", "e", "f"][-4:]
    assert stored["EMA"] == pytest.approx([0.9 * 0 + 0.1 * 2, 0.9 * 2 + 0.1 * 4], rel=1e-15)


def _numpy_moco(order):
    """MoCo with a bias-free linear encoder, in numpy, gradients by hand: normalize, masked
    InfoNCE (in-batch when the queue is empty), SGD on W_q, EMA of W_k, FIFO of 5."""
    weight, steps = golden.trajectory_inputs()
    p = golden.TRAJECTORY
    w_q, w_k = weight.numpy().copy(), weight.numpy().copy()
    queue, queue_ids = np.zeros((0, p["dim"])), np.zeros(0, dtype=int)
    out = {"keys": [], "losses": [], "queue_ids": [], "query_weight": [], "key_weight": []}
    for view_q, view_k, ids in steps:
        x_q, x_k, ids = view_q.numpy(), view_k.numpy(), ids.numpy()
        if order == "lab":
            w_k = p["m"] * w_k + (1 - p["m"]) * w_q
        z_q = x_q @ w_q.T
        q = z_q / np.linalg.norm(z_q, axis=1, keepdims=True)
        z_k = x_k @ w_k.T
        k = z_k / np.linalg.norm(z_k, axis=1, keepdims=True)
        if len(queue) == 0:
            candidates = k  # [B, d]: positive of row i at column i
            labels = np.arange(len(q))
            logits = q @ candidates.T / p["temperature"]
        else:
            candidates = None
            labels = np.zeros(len(q), dtype=int)
            negatives = q @ queue.T
            negatives[ids[:, None] == queue_ids[None, :]] = -np.inf
            logits = np.concatenate([(q * k).sum(1, keepdims=True), negatives], 1)
            logits /= p["temperature"]
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        rows = np.arange(len(q))
        out["losses"].append(float(-np.log(probs[rows, labels]).mean()))
        d_logits = probs.copy()
        d_logits[rows, labels] -= 1
        d_logits /= len(q) * p["temperature"]
        if candidates is not None:
            d_q = d_logits @ candidates
        else:
            d_q = d_logits[:, :1] * k + d_logits[:, 1:] @ queue
        norms = np.linalg.norm(z_q, axis=1, keepdims=True)
        d_z = (d_q - q * (d_q * q).sum(1, keepdims=True)) / norms
        w_q = w_q - p["lr"] * (d_z.T @ x_q)
        if order == "paper":
            w_k = p["m"] * w_k + (1 - p["m"]) * w_q
        queue = np.concatenate([queue, k])[-p["capacity"]:]
        queue_ids = np.concatenate([queue_ids, ids])[-p["capacity"]:]
        out["keys"].append(k)
        out["queue_ids"].append(queue_ids.tolist())
        out["query_weight"].append(w_q)
        out["key_weight"].append(w_k)
    return out


@pytest.mark.parametrize("order", ["paper", "lab"])
def test_trajectory_golden_matches_a_plain_numpy_moco(order):
    stored, independent = _stored(f"trajectory_{order}"), _numpy_moco(order)
    assert stored["ids"] == golden.TRAJECTORY_BATCHES
    assert stored["queue_ids"] == independent["queue_ids"]
    for name in ("keys", "losses", "query_weight", "key_weight"):
        for step, (a, b) in enumerate(zip(stored[name], independent[name])):
            assert np.allclose(a, b, rtol=1e-9, atol=1e-12), f"{name} differs at step {step}"


def test_the_trajectory_meets_collisions_and_wraps():
    """The golden's inputs exercise what they are meant to: the queue wraps mid-batch and
    sources recur while their old keys are still queued."""
    queue_ids = _stored("trajectory_lab")["queue_ids"]
    assert max(len(q) for q in queue_ids) == golden.TRAJECTORY["capacity"]
    recurring = [set(batch) & set(before) for batch, before in
                 zip(golden.TRAJECTORY_BATCHES[1:], queue_ids[:-1])]
    assert any(recurring)


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_check_reports_missing_unused_and_changed_values(produced_once, tmp_path):
    shutil.copytree(golden.DEFAULT_DIR, tmp_path, dirs_exist_ok=True)
    (tmp_path / "warmup.json").unlink()
    (tmp_path / "stray.json").write_text("{}")
    document = json.loads((tmp_path / "trajectory_lab.json").read_text())
    document["values"]["losses"]["value"][2] += 1e-6
    (tmp_path / "trajectory_lab.json").write_text(json.dumps(document))
    problems = "\n".join(golden.check(tmp_path))
    assert "warmup: missing golden file" in problems
    assert "stray: unused golden file" in problems
    assert "trajectory_lab:losses: 1 of " in problems
    assert "the largest of them at [2] differs by 1e-06 abs" in problems
    assert "a larger difference" not in problems


def test_the_reported_difference_is_the_named_entry_s_own():
    """A large value moved within its rtol differs by more than a small value moved beyond
    tolerance: the message names the small one with its own difference and states the larger
    one apart, instead of pairing one entry's values with another's difference."""
    entry = {"rtol": 1e-3, "atol": 1e-4}
    stored = {"history": {"value": [[1000.0, 2.0], [0.001]], **entry}}
    fresh = {"history": {"value": [[1000.5, 2.0], [0.011]], **entry}}
    (difference,) = golden.compare_values("run", stored, fresh)
    assert difference.line() == (
        "run:history: 1 of 3 values beyond tolerance; the largest of them at [1, 0] differs by "
        "0.01 abs, 10 rel (allowed 0.000101): golden 0.001, now 0.010999999999999999; "
        "a larger difference, 0.5 abs, is within the tolerance of its larger value "
        "(rtol 0.001, atol 0.0001)")


def _nudged(value, ulps: int):
    """Every float of a nested value moved by ``ulps`` units in the last place."""
    if isinstance(value, list):
        return [_nudged(item, ulps) for item in value]
    if isinstance(value, dict):
        return {key: _nudged(item, ulps) for key, item in value.items()}
    if isinstance(value, float) and value != 0.0:
        for _ in range(ulps):
            value = float(np.nextafter(value, np.inf))
        return value
    return value


def test_another_cpu_s_rounding_is_within_every_golden_s_tolerance(produced_once, tmp_path):
    """Another CPU, thread count or ATen kernel moves results by an ulp or two, in ragged
    values (the queue's keys over steps) as in rectangular ones: every golden still holds."""
    shutil.copytree(golden.DEFAULT_DIR, tmp_path, dirs_exist_ok=True)
    for path in tmp_path.glob("*.json"):
        document = json.loads(path.read_text())
        for entry in document["values"].values():
            entry["value"] = _nudged(entry["value"], 2)
        path.write_text(json.dumps(document))
    assert golden.check(tmp_path) == []


def test_a_ragged_value_beyond_tolerance_names_where(produced_once, tmp_path):
    shutil.copytree(golden.DEFAULT_DIR, tmp_path, dirs_exist_ok=True)
    document = json.loads((tmp_path / "trajectory_lab.json").read_text())
    keys = document["values"]["keys"]["value"]
    assert len({len(step) for step in keys}) > 1  # ragged: steps hold different counts
    keys[3][1][2] += 1e-3
    (tmp_path / "trajectory_lab.json").write_text(json.dumps(document))
    problems = "\n".join(golden.check(tmp_path))
    assert "trajectory_lab:keys: 1 of " in problems and "at [3, 1, 2]" in problems


def test_update_shows_the_diff_and_records_the_reason(produced_once, tmp_path, capsys):
    shutil.copytree(golden.DEFAULT_DIR, tmp_path, dirs_exist_ok=True)
    document = json.loads((tmp_path / "warmup.json").read_text())
    document["values"]["FIFO"]["value"] = ["a", "b", "c", "d"]
    (tmp_path / "warmup.json").write_text(json.dumps(document))
    assert main(["golden", "check", "--dir", str(tmp_path)]) == 1
    assert main(["golden", "update", "--dir", str(tmp_path), "--reason", "test reason"]) == 0
    out = capsys.readouterr().out
    assert ("warmup:FIFO: differs (values differ at [0]: 'a' != 'c') - golden "
            '["a", "b", "c", "d"], now ["c", "d", "e", "f"]') in out
    history = json.loads((tmp_path / "warmup.json").read_text())["history"]
    assert history[-1]["reason"] == "test reason" and history[-1]["changed"] == ["FIFO"]
    assert main(["golden", "check", "--dir", str(tmp_path)]) == 0


def test_update_requires_a_reason(tmp_path):
    with pytest.raises(ValueError, match="reason"):
        golden.update("  ", tmp_path)


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_digits_golden_is_reproduced_by_the_paper_order():
    """Route: the other step order (I6) reproduces the stored float32 run within its
    stated tolerance; queue ids exactly."""
    import torch

    from moco_ref.core.lab import train_moco
    from moco_ref.tools.data import load_digits_dataset
    from moco_ref.tools.models import SmallConvNet
    from moco_ref.tools.recipes import RECIPES

    stored, run = _stored("train_moco_digits"), golden.DIGITS_RUN
    data = load_digits_dataset()
    torch.manual_seed(run["seed"])
    model = SmallConvNet(data.channels, **RECIPES["lab07"].model)
    *_, queue, queue_ids, history, trace, drift = train_moco(
        model, data.images, torch.arange(run["items"]), run["epochs"], seed=run["seed"],
        views=golden._noise_views(run["seed"] + 1), order="paper")
    assert queue_ids.tolist() == stored["queue_ids"] and trace == stored["trace"]
    assert np.allclose(history, stored["history"], **golden.FLOAT32_RUN)
    assert np.allclose(queue.numpy(), stored["queue"], **golden.FLOAT32_RUN)
    assert drift == pytest.approx(stored["drift"], rel=golden.FLOAT32_RUN["rtol"])
