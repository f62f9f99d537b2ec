"""One training step of moco_ref.MoCo against the official-style module (ResNet-18 at 32×32,
batch 64), side by side at K = 4096 and 65536."""

import importlib.util
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
