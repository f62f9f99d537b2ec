"""``moco-ref train`` end to end on a small budget, and ``moco-ref walk --out``."""

from __future__ import annotations

import json
import platform

import numpy as np
import pytest
import torch

from moco_ref.cli import main
from moco_ref.tools.recipes import RECIPES
from moco_ref.tools.walk import run_walk
from moco_ref.tools.walk_figure import draw_walk, step_numbers

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_png(path):
    from matplotlib import image

    assert path.read_bytes()[:8] == PNG_MAGIC
    return image.imread(path)


def train(tmp_path, *extra, name="run"):
    out = tmp_path / name
    code = main(["train", "--out", str(out), *extra])
    return code, out


def test_lab07_recipe_is_lab07s_hyperparameters():
    lab = RECIPES["lab07"]
    assert (lab.m, lab.capacity, lab.batch_size, lab.lr, lab.temperature, lab.epochs) == (
        0.95, 240, 60, 0.002, 0.2, 15)
    assert lab.model["projection_dim"] == 24


def test_train_writes_metrics_and_figure(tmp_path, capsys):
    code, out = train(tmp_path, "--recipe", "lab07", "--epochs", "2", "--limit", "150",
                      "--order", "paper", "--seed", "3")
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"]) == 2
    assert all(isinstance(v, float) and np.isfinite(v) for v in metrics["history"])
    for stage in ("random_init", "trained"):
        for probe in ("linear", "knn"):
            assert 0.0 <= metrics["probe"][stage][probe] <= 1.0
    hyper = metrics["hyperparameters"]
    assert (hyper["m"], hyper["capacity"], hyper["batch_size"], hyper["temperature"],
            hyper["lr"], hyper["epochs"]) == (0.95, 240, 60, 0.2, 0.002, 2)
    assert metrics["order"] == "paper" and metrics["seed"] == 3
    assert metrics["data"]["train_items"] + metrics["data"]["held_out_items"] == 150
    assert metrics["versions"]["python"] == platform.python_version()
    assert metrics["versions"]["torch"] == torch.__version__
    assert {"numpy", "sklearn", "moco_ref"} <= set(metrics["versions"])
    assert metrics["wall_seconds"] > 0
    keys_seen = 2 * 105  # two epochs over the 70% of 150 items in the training split
    assert metrics["queue"] == {"size": min(keys_seen, 240), "capacity": 240}
    assert read_png(out / "training.png").ndim == 3
    printed = capsys.readouterr()
    assert "wrote" in printed.out and "epoch" in printed.err  # the tqdm bar


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_both_orders_give_the_same_training_run(tmp_path):
    runs = {}
    for order in ("paper", "lab"):
        code, out = train(tmp_path, "--epochs", "2", "--limit", "120", "--order", order,
                          name=order)
        assert code == 0
        runs[order] = json.loads((out / "metrics.json").read_text())
    assert runs["paper"]["history"] == runs["lab"]["history"]
    assert runs["paper"]["probe"]["trained"] == runs["lab"]["probe"]["trained"]
    assert runs["paper"]["trace"] == runs["lab"]["trace"]


def test_train_reads_a_user_npz(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 20)
    images = np.zeros((40, 8, 8), dtype=np.uint8)
    images[labels == 0, :, :4] = 255  # class 0 is bright on the left, class 1 on the right
    images[labels == 1, :, 4:] = 255
    images = np.clip(images.astype(int) - rng.integers(0, 60, images.shape), 0, 255)
    np.savez(tmp_path / "halves.npz", images=images.astype(np.uint8), labels=labels)
    code, out = train(tmp_path, "--data", str(tmp_path / "halves.npz"), "--epochs", "1")
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"]["name"] == "halves.npz" and metrics["data"]["items"] == 40


def test_missing_data_is_an_error_not_a_crash(tmp_path, capsys):
    code, out = train(tmp_path, "--data", str(tmp_path / "absent.npz"))
    assert code == 2
    assert "absent.npz" in capsys.readouterr().err and not out.exists()


def test_nonpositive_epochs_are_refused_by_the_parser(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        train(tmp_path, "--epochs", "0")
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_default_recipe_beats_random_init_by_ten_points(tmp_path):
    code, out = train(tmp_path)
    assert code == 0
    probe = json.loads((out / "metrics.json").read_text())["probe"]
    assert probe["trained"]["linear"] >= probe["random_init"]["linear"] + 0.10


# ---- walk --out ---------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["paper", "lab"])
def test_walk_out_draws_the_figure_and_keeps_the_text(tmp_path, capsys, order):
    main(["walk", "--order", order])
    text_only = capsys.readouterr().out
    path = tmp_path / f"walk_{order}.png"
    assert main(["walk", "--order", order, "--out", str(path)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(text_only)
    assert f"figure written to {path}" in printed
    height, width, _ = read_png(path).shape
    assert width > height > 300


@pytest.mark.parametrize("order", ["paper", "lab"])
def test_walk_figure_numbers_each_element_by_the_real_event_sequence(order):
    from matplotlib import pyplot as plt

    walk = run_walk(order)
    figure = draw_walk(walk)
    try:
        texts = [t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text"))]
        assert f"order: {order}" in figure._suptitle.get_text()
    finally:
        plt.close(figure)
    stages = [event.stage for event in walk.events]
    for position, stage in enumerate(stages, 1):
        assert f"{position}. {stage}" in texts  # the timeline, in the trainer's order
    ema = stages.index("EMA -> θk") + 1
    assert any(t.startswith(f"[{ema}] EMA") for t in texts)
    numbers = step_numbers(walk)
    if order == "lab":  # DESIGN I6: EMA -> key forward -> loss -> query update
        assert numbers["ema"] < numbers["key"] < numbers["loss"] < numbers["gradient"]
    else:  # key forward -> loss -> query update -> EMA -> enqueue
        assert numbers["key"] < numbers["loss"] < numbers["gradient"] < numbers["ema"]
    assert numbers["fifo"] == len(stages)
