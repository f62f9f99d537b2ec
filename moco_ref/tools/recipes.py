"""Named training recipes for ``moco-ref train``: model, augmentation and MoCo hyperparameters.

``lab07`` is LAB 07's setting (m = 0.95, a 240-key dictionary, batches of 60, Adam at
lr = 0.002, T = 0.2, 15 epochs) on the small CNN of ``moco_ref.tools.models``. ``default`` is this
project's recipe for the 8×8 digits within a one-minute CPU budget: a colder temperature
(T = 0.1) sharpens the contrast between positive and negatives, a slower key encoder
(m = 0.99) keeps a twice larger dictionary (480 keys, a third of the training set)
consistent, and 12 epochs fit the budget.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Recipe:
    name: str
    epochs: int
    m: float
    temperature: float
    capacity: int
    batch_size: int
    lr: float
    model: dict = field(default_factory=dict)  # keyword arguments of SmallConvNet
    augmentation: dict = field(default_factory=dict)  # keyword arguments of AugmentationStrength

    def to_dict(self) -> dict:
        return {**asdict(self), "optimizer": "Adam"}


SMALL_CNN = {"width": 16, "feature_dim": 16, "hidden_dim": 64, "projection_dim": 24,
             "norm": "batch"}
DIGIT_AUGMENTATION = {"crop_scale": (0.6, 1.0), "crop_ratio": (3 / 4, 4 / 3), "degrees": 12.0,
                      "translate": 0.1, "noise_sigma": 0.05}

RECIPES = {
    "default": Recipe(
        "default", epochs=12, m=0.99, temperature=0.1, capacity=480, batch_size=60, lr=0.002,
        model=SMALL_CNN, augmentation=DIGIT_AUGMENTATION,
    ),
    "lab07": Recipe(
        "lab07", epochs=15, m=0.95, temperature=0.2, capacity=240, batch_size=60, lr=0.002,
        model=SMALL_CNN, augmentation=DIGIT_AUGMENTATION,
    ),
}


def positive_int(text: str) -> int:
    """An argparse type: a whole number ≥ 1 (epochs, limits, threads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
