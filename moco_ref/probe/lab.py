"""What the ``lab`` probe is, computed the same way on both sides of the sandbox wall: its
images, its training ids, its initial model and its ``views``.

The submission's process records what the submission does with them
(``moco_ref.observe.lab_probe.ProbeRecorder``); the grader rebuilds them here from the probe's
description alone, to check and recompute what was recorded.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from moco_ref.probe.cases import LabProbe

IMAGE_SHAPE = (1, 8, 8)
PIXELS = math.prod(IMAGE_SHAPE)
FEATURE_DIM = 16
PROJECTION_DIM = 24
VIEW_NOISE = 0.1
MAX_SNAPSHOT_INSTANCES = 6  # copies snapshotted per forward (the most recently made)
MAX_EVENTS = 2000  # forwards recorded; later ones are counted only


class ProbeNet(nn.Module):
    """``[B, 1, 8, 8]`` → ``([B, 16] features, [B, 24] projection)``; float32."""

    # an observer (``on_forward``, ``register``) set on a per-probe subclass, never copied
    recorder = None

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(PIXELS, FEATURE_DIM), nn.Tanh())
        self.projector = nn.Linear(FEATURE_DIM, PROJECTION_DIM)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(images.to(torch.float32))  # [B, 16]
        projection = self.projector(features)  # [B, 24]
        if self.recorder is not None:
            self.recorder.on_forward(self, images, projection)
        return features, projection

    def __deepcopy__(self, memo: dict) -> ProbeNet:
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            object.__setattr__(clone, name, copy.deepcopy(value, memo))
        if self.recorder is not None:
            self.recorder.register(clone)
        return clone


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """All parameters of ``module`` as one detached float32 vector ``[P]``."""
    params = [p.detach().reshape(-1).to(torch.float32) for p in module.parameters()]
    return torch.cat(params) if params else torch.empty(0)


def parameter_layout(module: nn.Module) -> list[dict]:
    return [
        {"name": name, "shape": list(p.shape), "numel": p.numel()}
        for name, p in module.named_parameters()
    ]


class LabProbeWorld:
    """The probe's inputs from its description: images ``[N, 1, 8, 8]``, the training ids,
    the initial model (``net_class``, seeded) and its flat parameters, and ``view``."""

    def __init__(self, probe: LabProbe, net_class: type[ProbeNet] = ProbeNet) -> None:
        self.probe = probe
        generator = torch.Generator().manual_seed(1_000_003 * probe.seed + 17)
        # [N, 1, 8, 8]
        self.images = torch.rand((probe.n_images, *IMAGE_SHAPE), generator=generator)
        order = torch.randperm(probe.n_images, generator=generator)
        self.train = order[: probe.n_train].sort().values  # [n_train] scattered ids
        with torch.random.fork_rng():
            torch.manual_seed(probe.seed + 5)
            self.initial = net_class()
        self.initial_params = flat_parameters(self.initial)

    def view(self, call: int, batch: torch.Tensor) -> torch.Tensor:
        """The probe's augmentation at its ``call``-th use: the images plus seeded noise,
        unique per call and row."""
        generator = torch.Generator().manual_seed(7_919 * self.probe.seed + 104_729 * (call + 1))
        images = torch.as_tensor(batch).detach().to(torch.float32)
        noise = VIEW_NOISE * torch.randn(images.shape, generator=generator)
        return (images + noise).reshape(images.shape)
