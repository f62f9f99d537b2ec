"""The warm process lets torch's optimizers run without importing the compiler
(``zygote.eager_optimizers``): the updates stay bit for bit those of unpatched torch, and
``torch._dynamo`` is never imported. Each side runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.full  # the second tier: starts the real sandbox per case

SCRIPT = r"""
import json, sys
import torch
if sys.argv[1] == "eager":
    from moco_ref.sandbox.zygote import eager_optimizers
    eager_optimizers()
torch.manual_seed(0)
out = {}
for name, make in [("SGD", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4)),
                   ("Adam", lambda p: torch.optim.Adam(p, lr=1e-2)),
                   ("AdamW", lambda p: torch.optim.AdamW(p, lr=1e-2)),
                   ("RMSprop", lambda p: torch.optim.RMSprop(p, lr=1e-3))]:
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    optimizer = make(model.parameters())
    for step in range(4):
        optimizer.zero_grad()
        model(torch.randn(8, 5)).square().mean().backward()
        optimizer.step()
    optimizer.load_state_dict(optimizer.state_dict())
    grad_mode = torch.is_grad_enabled()
    out[name] = [torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(),
                 grad_mode]
out["dynamo"] = "torch._dynamo" in sys.modules
print(json.dumps(out))
"""


def _run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                          check=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_optimizers_update_identically_without_importing_the_compiler():
    plain, eager = _run("plain"), _run("eager")
    assert plain.pop("dynamo") is True  # unpatched torch imports it on the first step
    assert eager.pop("dynamo") is False
    assert eager == plain  # parameters bit for bit (floats through JSON round-trip exactly)
