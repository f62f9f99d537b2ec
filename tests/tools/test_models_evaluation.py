"""The small CNN's interface, and the frozen-feature probes (linear and cosine kNN)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from moco_ref.tools.evaluation import (
    extract_features,
    knn_accuracy,
    linear_probe_accuracy,
    probe_encoder,
)
from moco_ref.tools.models import SmallConvNet


def test_small_cnn_returns_features_and_a_24d_projection():
    model = SmallConvNet().eval()
    images = torch.rand(5, 1, 8, 8)
    features, projection = model(images)
    assert features.shape == (5, 16) and projection.shape == (5, 24)
    assert torch.equal(model.encoder(images), features)  # features are the encoder's output


def test_small_cnn_dimensions_and_channels_are_configurable():
    model = SmallConvNet(3, width=4, feature_dim=10, hidden_dim=7, projection_dim=5, norm="none")
    features, projection = model(torch.rand(2, 3, 32, 32))
    assert features.shape == (2, 10) and projection.shape == (2, 5)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: SmallConvNet(norm="layer"), ValueError, "norm must be one of"),
        (lambda: SmallConvNet(feature_dim=0), ValueError, "feature_dim must be >= 1"),
        (lambda: SmallConvNet()(torch.rand(2, 8, 8)), ValueError, r"\[B, C, H, W\]"),
    ],
)
def test_bad_model_arguments_are_rejected(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_linear_probe_separates_separable_classes_and_not_noise():
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1, 2], 40)
    informative = np.eye(3)[labels] * 5 + rng.normal(size=(120, 3))  # class in the features
    noise = rng.normal(size=(120, 3))  # nothing about the class
    train, test = np.arange(0, 120, 2), np.arange(1, 120, 2)
    good = linear_probe_accuracy(informative[train], labels[train], informative[test],
                                 labels[test])
    blind = linear_probe_accuracy(noise[train], labels[train], noise[test], labels[test])
    assert good == 1.0 and blind < 0.6


def test_knn_votes_by_angle_not_distance():
    # The test point is 1.0 away from (1, 0) but 3 degrees from (10, 10): cosine says class 1.
    train = np.array([[1.0, 0.0], [10.0, 10.0]])
    test = np.array([[0.9, 1.0]])
    assert knn_accuracy(train, np.array([0, 1]), test, np.array([1]), k=1) == 1.0
    with pytest.raises(ValueError, match="k must not exceed the 2 training items"):
        knn_accuracy(train, np.array([0, 1]), test, np.array([1]), k=3)


def test_probe_reads_the_first_output_and_restores_the_training_mode():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Identity()

        def forward(self, x):
            return x.flatten(1), torch.zeros(len(x), 2)  # features carry the class

    model = Model().train()
    labels = torch.arange(4).repeat_interleave(10)
    images = (torch.nn.functional.one_hot(labels, 4).float() * 3)[:, None, None, :]
    images = images + 0.1 * torch.randn(images.shape, generator=torch.Generator().manual_seed(0))
    assert extract_features(model, images).shape == (40, 4)
    scores = probe_encoder(model, images, labels, torch.arange(0, 40, 2), torch.arange(1, 40, 2))
    assert scores == {"linear": 1.0, "knn": 1.0}
    assert model.training


def test_mismatched_probe_inputs_are_rejected():
    with pytest.raises(ValueError, match="one label each"):
        linear_probe_accuracy(np.zeros((3, 2)), np.zeros(2), np.zeros((1, 2)), np.zeros(1))
    with pytest.raises(ValueError, match="differ in width"):
        knn_accuracy(np.zeros((3, 2)), np.zeros(3), np.zeros((1, 3)), np.zeros(1))
