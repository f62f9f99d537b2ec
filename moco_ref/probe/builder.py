"""What the ``builder`` probe is, the same on both sides of the sandbox wall: the sizes the
grader builds an official-style ``MoCo`` module with and trains it for (the main, ragged and
two-process runs), the encoder it supplies as ``base_encoder`` and the images of every step.

The submission's process records what the module does with them
(``moco_ref.observe.builder_probe``); the grader rebuilds them here to check and recompute
what was recorded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from moco_ref.probe.options import GradeOptions, course_draw

IMAGE_SHAPE = (3, 8, 8)
# What a module may call its two encoders: the official names first, then the other names
# MoCo code goes by (the query encoder first). The first pair the module has both of is
# followed as encoder_q and encoder_k.
ENCODER_NAMES = (("encoder_q", "encoder_k"), ("query_encoder", "key_encoder"),
                 ("encoder", "momentum_encoder"), ("student", "teacher"),
                 ("online_encoder", "target_encoder"), ("online_network", "target_network"),
                 ("net_q", "net_k"), ("model_q", "model_k"), ("backbone", "momentum_backbone"),
                 ("backbone", "backbone_momentum"))
WIDTH = 20  # channels of the probe encoder, the input width of its .fc (≠ dim, so a head
# sized from the wrong axis of fc.weight shows)
FC_GAIN = 4.0  # raw outputs of norm ≫ 1, so a missing L2 normalization is visible
QUERY_VIEW, KEY_VIEW = 0, 1  # the views a traced row comes from: im_q, im_k
VIEW_NAMES = ("im_q", "im_k")
BATCH_SPLITS = 8  # every probe batch divides into 1, 2, 4 or 8 split-BatchNorm slices
BATCH_CHOICES = (8, 16)  # the batches a course key draws from (multiples of BATCH_SPLITS)
# dims a course key draws from: never WIDTH, never a number of keys one enqueue can bring (a
# batch, both views' keys of a symmetric module, a world batch: multiples of BATCH_SPLITS),
# so a module that counts its keys along the feature axis cannot pass by a coincidence
DIM_CHOICES = (12, 28, 36)


@dataclass(frozen=True)
class BuilderProbe:
    """What the grader builds the module with and how long it trains it. K is a multiple of
    the batch (the official module asserts it) and ``steps · batch > K``, so the queue wraps
    and the keys of the first steps are dropped again. Every batch an encoder sees (main,
    ragged, mlp and each rank's) is a multiple of ``BATCH_SPLITS``: encoders with split
    BatchNorm (statistics per slice of the batch, as MoCo's CIFAR demos simulate several
    GPUs) need the batch to divide into their slices."""

    dim: int = 12  # ≠ WIDTH, and no enqueue's number of keys (see DIM_CHOICES)
    K: int = 48
    batch: int = 8
    steps: int = 10
    m: float = 0.9
    T: float = 0.2
    lr: float = 0.5
    seed: int = 0
    mlp_steps: int = 2
    # a ragged run: K not a multiple of the batch, so an enqueue wraps in mid-batch; a module
    # may refuse it loudly (the official asserts K % batch == 0), never drop keys silently
    ragged_K: int = 20
    ragged_steps: int = 5
    # a two-process run: each rank trains on its own ranks_batch images of one world batch;
    # ranks_K is a multiple of the world batch and ranks_steps · world batch > ranks_K (a
    # symmetric module's K is the next multiple of twice the world batch: see ranks_probe)
    ranks: int = 2
    ranks_batch: int = 8
    ranks_K: int = 32
    ranks_steps: int = 4
    symmetric: bool = False  # --variant symmetric: built with symmetric=True where it exists

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BuilderProbe:
        """The probe a record names; defaults for what it does not name (e.g. the
        placeholder of an observation that never finished)."""
        defaults = asdict(cls())
        return cls(**{name: type(default)(data[name]) for name, default in defaults.items()
                      if name in data})


def ragged_probe(probe: BuilderProbe) -> BuilderProbe:
    """The probe of the ragged run: the same module, K not a multiple of the batch."""
    return replace(probe, K=probe.ragged_K, steps=probe.ragged_steps)


def default_builder_probe(options: GradeOptions) -> BuilderProbe:
    """The probe for ``options``: T is ``--temperature``, m is ``--expect-m`` when pinned.
    With a course's probe key its sizes and seed are drawn from the key (as the ``lab``
    probe's are): ``dim`` never the encoder's width, K a multiple of twice the batch (so a
    symmetric module, which enqueues both views' keys, meets the official module's
    ``K % keys == 0`` as the default probe's K = 48 does), the queue
    wrapping within the run, the ragged K never a multiple of the batch, the batch a multiple
    of ``BATCH_SPLITS``."""
    probe = BuilderProbe(T=float(options.temperature), seed=int(options.seed),
                         symmetric=options.variant == "symmetric")
    if options.probe_key:
        draw = course_draw("builder", options.probe_key, options.seed)
        batch = draw.choice(BATCH_CHOICES)
        K = 2 * batch * draw.randint(3, 4)  # a symmetric module enqueues both views: 2B a step
        ragged_K = draw.choice([k for k in range(K // 2, K) if k % batch])
        probe = replace(probe, dim=draw.choice(DIM_CHOICES), batch=batch, K=K,
                        steps=K // batch + draw.randint(3, 5), ragged_K=ragged_K,
                        ragged_steps=ragged_K // batch + 2,
                        seed=draw.randint(0, 2**31 - 1))
    return probe if options.expect_m is None else replace(probe, m=float(options.expect_m))


# --------------------------------------------------------------------------- encoder


class ProbeEncoder(nn.Module):
    """``[B, 3, 8, 8]`` → ``[B, num_classes]``: conv → BatchNorm → ReLU → pool → ``.fc``
    (the torchvision ResNet interface MoCo code expects: the last layer is a Linear ``fc``)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(IMAGE_SHAPE[0], WIDTH, 3, padding=1),
            nn.BatchNorm2d(WIDTH),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(WIDTH, num_classes)
        with torch.no_grad():
            self.fc.weight.mul_(FC_GAIN)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(images))  # [B, num_classes]


PROBE_LAYERS = ("ProbeEncoder", "Sequential", "Conv2d", "BatchNorm2d", "ReLU",
                "AdaptiveAvgPool2d", "Flatten", "Linear")


def is_intact_probe_encoder(module: nn.Module) -> bool:
    """The grader's encoder (or a copy) with its layers as built: its output is then a known
    function of its parameters and its input, which the judge recomputes."""
    return type(module) is ProbeEncoder and tuple(
        type(m).__name__ for m in module.modules()) == PROBE_LAYERS


def probe_images(probe: BuilderProbe, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two views ``[B, 3, 8, 8]`` of the same ``B`` random images, distinct per step."""
    generator = torch.Generator().manual_seed(1_000_003 * probe.seed + 7_919 * (step + 1))
    images = torch.rand((probe.batch, *IMAGE_SHAPE), generator=generator)
    noise = 0.1 * torch.randn((2, probe.batch, *IMAGE_SHAPE), generator=generator)
    return images + noise[0], images + noise[1]


NO_MLP_OPTION = "no mlp option"  # the stage of an mlp=True run of a module without `mlp`


def ranks_probe(probe: BuilderProbe, *, symmetric: bool = False) -> BuilderProbe:
    """The probe of one rank in the two-process run (``batch`` is the per-rank batch). A
    symmetric module enqueues both views' keys, twice the world batch per step, so its K is the
    smallest multiple of that not below ``ranks_K`` (the queue still wraps within the run)."""
    K = probe.ranks_K
    if symmetric:
        block = 2 * probe.ranks * probe.ranks_batch
        K = -(-K // block) * block
    return replace(probe, K=K, batch=probe.ranks_batch, steps=probe.ranks_steps)


def is_symmetric_run(run) -> bool:
    """Whether a recorded run's forward gave two (logits, labels) pairs at its first step (a
    symmetric module: returned, or the two cross-entropies of a returned loss). Both sides read
    the variant from the main run this way: the observer sizes the two-process run for it and
    the judge judges both runs as such."""
    steps = run.get("steps") if isinstance(run, dict) else None
    if not isinstance(steps, list) or not steps or not isinstance(steps[0], dict):
        return False
    pairs = steps[0].get("pairs")
    return isinstance(pairs, list) and len(pairs) == 2


def world_images(probe: BuilderProbe, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Both views of the world batch ``[ranks · batch, 3, 8, 8]`` of ``step``."""
    return probe_images(replace(probe, batch=probe.ranks * probe.batch), step)
