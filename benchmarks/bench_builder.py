"""One training step of moco_ref.MoCo against the official-style module (ResNet-18 at 32×32,
batch 64), side by side at K = 4096 and 65536."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from moco_ref import MoCo

ROOT = Path(__file__).resolve().parents[1]
BATCH = 64


def _official_style():
    spec = importlib.util.spec_from_file_location(
        "official_style", ROOT / "examples" / "builder" / "official_style.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MoCo


@pytest.mark.parametrize("K", [4096, 65536])
@pytest.mark.parametrize("kind", ["moco_ref", "official_style"])
def test_training_step(benchmark, kind, K):
    torchvision = pytest.importorskip("torchvision")
    benchmark.group = f"MoCo step ResNet-18 32x32 batch {BATCH} K={K}"
    torch.manual_seed(0)
    cls = MoCo if kind == "moco_ref" else _official_style()
    model = cls(torchvision.models.resnet18, dim=128, K=K, m=0.999, T=0.07)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
    im_q, im_k = torch.randn(2, BATCH, 3, 32, 32)

    def step():
        logits, labels = model(im_q, im_k)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    loss = benchmark.pedantic(step, rounds=5, warmup_rounds=1)
    assert torch.isfinite(loss)


ROUNDS = int(os.environ.get("MOCO_REF_STEP_ROUNDS", "40"))
REPEATS = 3  # steps of each module per round


def _bootstrap_interval(ratios: list[float], draws: int = 2000, level: float = 0.95):
    """The percentile bootstrap interval of the median paired ratio."""
    import random
    import statistics

    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(draws))
    low = medians[int((1 - level) / 2 * draws)]
    high = medians[int((1 + level) / 2 * draws) - 1]
    return low, high


def test_step_ratio_interleaved(benchmark):
    """moco_ref.MoCo's step over the official-style module's at K = 65536, measured in
    interleaved rounds (each round times a few steps of each, in alternating order, after a
    warm-up, and keeps each module's fastest), so drift of this shared machine hits both
    alike; extra_info holds the median ratio over the rounds and its 95% bootstrap
    interval."""
    import statistics
    import time

    torchvision = pytest.importorskip("torchvision")
    benchmark.group = "MoCo step ratio moco_ref / official, K=65536 (interleaved)"
    steps = {}
    for kind, cls in (("moco_ref", MoCo), ("official_style", _official_style())):
        torch.manual_seed(0)
        model = cls(torchvision.models.resnet18, dim=128, K=65536, m=0.999, T=0.07)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9,
                                    weight_decay=1e-4)
        im_q, im_k = torch.randn(2, BATCH, 3, 32, 32)

        def step(model=model, optimizer=optimizer, im_q=im_q, im_k=im_k):
            logits, labels = model(im_q, im_k)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        steps[kind] = step
        step()  # warm-up
    ratios = []

    def one_round():
        order = ("moco_ref", "official_style") if len(ratios) % 2 == 0 else (
            "official_style", "moco_ref")
        seconds = {}
        for kind in order:  # the fastest of a few steps: interference only ever adds time
            times = []
            for _ in range(REPEATS):
                started = time.perf_counter()
                steps[kind]()
                times.append(time.perf_counter() - started)
            seconds[kind] = min(times)
        ratios.append(seconds["moco_ref"] / seconds["official_style"])

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    low, high = _bootstrap_interval(ratios)
    benchmark.extra_info.update(ratio_median=round(statistics.median(ratios), 3),
                                ratio_ci95=[round(low, 3), round(high, 3)])
    print(dict(benchmark.extra_info))
    assert len(ratios) == ROUNDS
