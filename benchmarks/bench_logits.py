"""Same-source masking overhead: masked against unmasked logits at K = 65536."""

import pytest
import torch

from moco_ref import contrastive_logits

B, K, DIM = 256, 65536, 128


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_logits(benchmark, masked):
    benchmark.group = f"logits B={B} K={K} dim={DIM}"
    generator = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(B, DIM, generator=generator), dim=1)
    k = torch.nn.functional.normalize(torch.randn(B, DIM, generator=generator), dim=1)
    queue = torch.nn.functional.normalize(torch.randn(K, DIM, generator=generator), dim=1)
    ids = torch.randint(0, 50000, (B,), generator=generator)
    queue_ids = torch.randint(0, 50000, (K,), generator=generator)
    args = (queue_ids, ids) if masked else (None, None)
    logits = benchmark(contrastive_logits, q, k, queue, *args, 0.07)
    assert logits.shape == (B, 1 + K)
