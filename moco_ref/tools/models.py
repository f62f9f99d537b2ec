"""A small CNN of the kind LAB 07 trains: ``model.encoder`` maps images to a compact feature
vector, a projection head maps features to the contrastive embedding, and ``model(x)``
returns ``(features, projection)``.

The encoder ends in global average pooling into a compact feature vector (16 numbers by
default), so its features carry no pixel layout that a linear probe could read directly.

Normalization: with ``norm="batch"`` (the default) every convolution is followed by batch
normalization. Without it (``norm="none"``) this small network collapses under the
InfoNCE loss on digits: the last ReLU units die and every image gets the same embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from moco_ref.core.validation import require_count


class SmallConvNet(nn.Module):
    """``[B, C, H, W]`` images → ``([B, feature_dim] features, [B, projection_dim] embedding)``.

    ``encoder``: three 3×3 convolutions (``width``, ``2·width``, ``feature_dim`` channels, a
    2×2 max-pool after the second), each followed by ``norm`` and a ReLU, then global average
    pooling. ``projector``: a hidden layer of ``hidden_dim`` units and a linear map to
    ``projection_dim``.
    """

    NORMS = ("batch", "none")

    def __init__(
        self,
        in_channels: int = 1,
        *,
        width: int = 16,
        feature_dim: int = 16,
        hidden_dim: int = 64,
        projection_dim: int = 24,
        norm: str = "batch",
    ) -> None:
        super().__init__()
        if norm not in self.NORMS:
            raise ValueError(f"norm must be one of {self.NORMS}, got {norm!r}")
        in_channels = require_count("in_channels", in_channels)
        width = require_count("width", width)
        self.feature_dim = require_count("feature_dim", feature_dim)
        hidden_dim = require_count("hidden_dim", hidden_dim)
        self.projection_dim = require_count("projection_dim", projection_dim)
        self.norm = norm
        self.encoder = nn.Sequential(
            *_conv_block(in_channels, width, norm),
            *_conv_block(width, 2 * width, norm),
            nn.MaxPool2d(2),
            *_conv_block(2 * width, self.feature_dim, norm),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.projector = nn.Sequential(
            nn.Linear(self.feature_dim, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, self.projection_dim),
        )

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if images.ndim != 4:
            raise ValueError(
                f"images must have shape [B, C, H, W], got shape {list(images.shape)}"
            )
        features = self.encoder(images)  # [B, feature_dim]
        return features, self.projector(features)  # [B, projection_dim]


def _conv_block(in_channels: int, out_channels: int, norm: str) -> list[nn.Module]:
    """3×3 convolution (same size), optional batch norm, ReLU."""
    if norm == "batch":
        return [
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        ]
    return [nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.ReLU()]
