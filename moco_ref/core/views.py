"""Two random views of a batch of small images, for the query and the key.

``make_views(seed)`` returns a callable ``views(batch) -> batch`` that gives every image its
own random resized crop, small affine jitter (rotation and shift) and light Gaussian noise.
The geometry is done by ``torchvision.transforms.v2.functional``; every random number comes
from the callable's own ``torch.Generator``, so a run is reproducible from its seed, the
global RNG is never touched, and two successive calls (query view, key view) differ.

torchvision is imported here only, so that the core of ``moco_ref`` imports without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from moco_ref.core.validation import require_count, require_tensor


@dataclass(frozen=True)
class AugmentationStrength:
    """How far a view may stray from its image. The defaults suit 8×8 digits: a digit stays
    legible after a crop of at least 60% of its area, 12° of rotation and a one-pixel shift."""

    crop_scale: tuple[float, float] = (0.6, 1.0)  # fraction of the image area kept
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # aspect ratio of the crop box
    degrees: float = 12.0  # rotation drawn from [-degrees, degrees]
    translate: float = 0.1  # shift up to this fraction of the side, in each direction
    noise_sigma: float = 0.05  # std of the additive noise, in units of the [0, 1] range

    def __post_init__(self) -> None:
        low, high = self.crop_scale
        if not 0.0 < low <= high <= 1.0:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}")
        low, high = self.crop_ratio
        if not 0.0 < low <= high:
            raise ValueError(f"crop_ratio must satisfy 0 < low <= high, got {self.crop_ratio}")
        if not 0.0 <= self.degrees <= 180.0:
            raise ValueError(f"degrees must lie in [0, 180], got {self.degrees}")
        if not 0.0 <= self.translate <= 1.0:
            raise ValueError(f"translate must lie in [0, 1], got {self.translate}")
        if not 0.0 <= self.noise_sigma:
            raise ValueError(f"noise_sigma must be >= 0, got {self.noise_sigma}")


class RandomViews:
    """``views(batch)``: ``[B, C, H, W]`` floats in [0, 1] → ``[B, C, S, S]`` (S = ``image_size``),
    each image augmented independently."""

    def __init__(
        self, seed: int, image_size: int = 8, strength: AugmentationStrength | None = None
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.image_size = require_count("image_size", image_size)
        self.strength = AugmentationStrength() if strength is None else strength
        if not isinstance(self.strength, AugmentationStrength):
            raise TypeError(
                f"strength must be an AugmentationStrength, got {type(self.strength).__name__}"
            )
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        batch = require_tensor("batch", batch)
        if batch.ndim != 4 or not batch.is_floating_point():
            raise ValueError(
                "batch must be a floating-point tensor of shape [B, C, H, W], "
                f"got {batch.dtype} {list(batch.shape)}"
            )
        count, size = len(batch), [self.image_size, self.image_size]
        boxes = self._crop_boxes(count, batch.shape[-2], batch.shape[-1])  # [B, 4]
        reach = self.strength.translate * self.image_size
        angles = self._uniform(count, -self.strength.degrees, self.strength.degrees)  # [B]
        shifts = self._uniform(count, -reach, reach, columns=2)  # [B, 2]
        views = [
            TF.affine(
                TF.resized_crop(image, *box, size, antialias=False),
                angle=angle, translate=shift, scale=1.0, shear=[0.0, 0.0],
                interpolation=InterpolationMode.BILINEAR,
            )
            for image, box, angle, shift in zip(
                batch, boxes.tolist(), angles.tolist(), shifts.tolist()
            )
        ]  # B × [C, S, S]
        out = torch.stack(views) if views else batch.new_zeros(0, batch.shape[1], *size)
        if self.strength.noise_sigma > 0:
            noise = torch.randn(out.shape, generator=self.generator, dtype=out.dtype)
            out = out + self.strength.noise_sigma * noise
        return out.clamp(0.0, 1.0)

    def _crop_boxes(self, count: int, height: int, width: int) -> torch.Tensor:
        """``[B, 4]`` int64 boxes ``(top, left, height, width)`` of random area fraction and
        aspect ratio, drawn as ``RandomResizedCrop`` draws them: the first of ten tries that
        fits inside the image, else the whole image."""
        tries = 10
        scale = self._uniform(count, *self.strength.crop_scale, columns=tries)  # [B, 10]
        low_ratio, high_ratio = (math.log(r) for r in self.strength.crop_ratio)
        ratio = self._uniform(count, low_ratio, high_ratio, columns=tries).exp()  # [B, 10]
        target = height * width * scale
        box_w = (target * ratio).sqrt().round().long()  # [B, 10]
        box_h = (target / ratio).sqrt().round().long()
        fits = (box_w > 0) & (box_w <= width) & (box_h > 0) & (box_h <= height)
        first = fits.int().argmax(dim=1, keepdim=True)  # [B, 1] the first try that fits
        any_fits = fits.any(dim=1)
        box_h = torch.where(any_fits, box_h.gather(1, first)[:, 0], height)  # [B]
        box_w = torch.where(any_fits, box_w.gather(1, first)[:, 0], width)
        top = (self._uniform(count, 0.0, 1.0) * (height - box_h + 1)).floor().long()
        left = (self._uniform(count, 0.0, 1.0) * (width - box_w + 1)).floor().long()
        return torch.stack([top, left, box_h, box_w], dim=1)

    def _uniform(self, count: int, low: float, high: float, columns: int = 0) -> torch.Tensor:
        """``[B]`` (or ``[B, columns]``) float64 draws from U[low, high)."""
        shape = (count, columns) if columns else (count,)
        draws = torch.rand(shape, generator=self.generator, dtype=torch.float64)
        return low + (high - low) * draws


def make_views(
    seed: int, image_size: int = 8, strength: AugmentationStrength | None = None
) -> RandomViews:
    """A reproducible ``views(batch) -> batch`` for small images; see ``RandomViews``."""
    return RandomViews(seed, image_size, strength)
