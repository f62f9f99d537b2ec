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
PIXEL_MAX = 16  # LAB 07's digits: float32 pixels holding the integers 0..16
FEATURE_DIM = 16
PROJECTION_DIM = 24
VIEW_NOISE = 0.1 * PIXEL_MAX
STROKE_REACH = 1.45  # pixels within this distance of a stroke are inked: about half the
# pixels stay 0 and the mean is about 5, as in the digits
MAX_SNAPSHOT_INSTANCES = 6  # copies snapshotted per forward (the most recently made)
MAX_EVENTS = 2000  # forwards recorded; later ones are counted only
HANDED_NAME = "Net"  # what the model class handed to train_moco is called
HANDED_FILE = "<string>"  # where its code and views' say they come from


def net_class(name: str = "ProbeNet", module: str = __name__, *, on_forward=None,
              on_copy=None) -> type[nn.Module]:
    """The probe's model class: ``[B, 1, 8, 8]`` pixels 0..16 → ``([B, 16] features,
    [B, 24] projection)``, float32, with LAB 07's interface (``.encoder``). Every class this
    makes builds the same parameters under the same seed and computes the same function.

    The grader's own (the default) has no hooks. The one handed to a submission is named
    ``name`` in ``module`` (the submission's own, as a notebook's class would be), its code
    says it comes from ``HANDED_FILE``, and what records it is reached only through its
    methods' closures: ``on_forward(model, images, projection)`` after each forward,
    ``on_copy(clone)`` for each deep copy."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(PIXELS, FEATURE_DIM), nn.Tanh())
        self.projector = nn.Linear(FEATURE_DIM, PROJECTION_DIM)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(images.to(torch.float32) / PIXEL_MAX)  # [B, 16]
        projection = self.projector(features)  # [B, 24]
        if on_forward is not None:
            on_forward(self, images, projection)
        return features, projection

    methods = {"__init__": __init__, "forward": forward}
    if on_copy is not None:
        def __deepcopy__(self, memo: dict):
            clone = type(self).__new__(type(self))
            memo[id(self)] = clone
            for key, value in self.__dict__.items():
                object.__setattr__(clone, key, copy.deepcopy(value, memo))
            on_copy(clone)
            return clone

        methods["__deepcopy__"] = __deepcopy__
    if module != __name__:
        methods = {key: as_if_from(function, module, f"{name}.{key}")
                   for key, function in methods.items()}
    return type(name, (nn.Module,), {"__module__": module, "__qualname__": name, **methods})


def as_if_from(function, module: str, qualname: str):
    """``function`` as if defined in ``module`` at ``qualname`` from ``HANDED_FILE``: the
    names a submission can read off a handed object say nothing of the grader."""
    function.__code__ = function.__code__.replace(co_filename=HANDED_FILE,
                                                  co_qualname=qualname)
    function.__module__, function.__qualname__ = module, qualname
    return function


ProbeNet = net_class()


def digit_like_images(count: int, generator: torch.Generator) -> torch.Tensor:
    """``[count, 1, 8, 8]`` float32 images like LAB 07's digits, all distinct: two to four
    pen strokes (segments inside the middle six columns) inked 16 at the stroke and fading to
    0 at ``STROKE_REACH``, rounded to integers."""
    strokes = torch.randint(2, 5, (count,), generator=generator)  # [N]
    ends = torch.rand((count, 4, 2, 2), generator=generator)  # [N, stroke, end, (row, col)]
    ends = ends * torch.tensor([7.0, 5.0]) + torch.tensor([0.0, 1.0])
    rows, cols = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    pixels = torch.stack([rows, cols], dim=-1).reshape(1, 1, PIXELS, 2)  # [1, 1, 64, 2]
    start, along = ends[:, :, :1], ends[:, :, 1:] - ends[:, :, :1]  # [N, 4, 1, 2]
    t = ((pixels - start) * along).sum(-1) / (along * along).sum(-1).clamp_min(1e-6)
    nearest = start + t.clamp(0, 1)[..., None] * along  # [N, 4, 64, 2]
    ink = (STROKE_REACH - (pixels - nearest).norm(dim=-1)).clamp(0, 1)  # [N, 4, 64]
    ink = ink * (torch.arange(4) < strokes[:, None]).unsqueeze(-1)
    images = (PIXEL_MAX * ink.amax(dim=1)).round().reshape(count, *IMAGE_SHAPE)
    return _distinct(images)


def _distinct(images: torch.Tensor) -> torch.Tensor:
    """``images`` with any repeated image changed in its corner pixel until it is unique."""
    seen: set[bytes] = set()
    for image in images:
        while (key := image.numpy().tobytes()) in seen:
            image[0, 0, 0] = (image[0, 0, 0] + 1) % (PIXEL_MAX + 1)
        seen.add(key)
    return images


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
    the initial model (an instance of ``model_class``, seeded) and its flat parameters, and
    ``view``."""

    def __init__(self, probe: LabProbe, model_class: type[nn.Module] = ProbeNet) -> None:
        self.probe = probe
        generator = torch.Generator().manual_seed(1_000_003 * probe.seed + 17)
        self.images = digit_like_images(probe.n_images, generator)  # [N, 1, 8, 8]
        order = torch.randperm(probe.n_images, generator=generator)
        self.train = order[: probe.n_train].sort().values  # [n_train] scattered ids
        with torch.random.fork_rng():
            torch.manual_seed(probe.seed + 5)
            self.initial = model_class()
        self.initial_params = flat_parameters(self.initial)

    def view(self, call: int, batch: torch.Tensor) -> torch.Tensor:
        """The probe's augmentation at its ``call``-th use: the images plus seeded noise,
        unique per call and row."""
        generator = torch.Generator().manual_seed(7_919 * self.probe.seed + 104_729 * (call + 1))
        images = torch.as_tensor(batch).detach().to(torch.float32)
        noise = VIEW_NOISE * torch.randn(images.shape, generator=generator)
        return (images + noise).reshape(images.shape)
