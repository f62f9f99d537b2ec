"""How good are an encoder's frozen features? A linear probe and a kNN vote on a held-out split.

The encoder is never trained here: its features for the training split fit a standardized
logistic regression (linear probe) or serve as the labelled neighbours (cosine kNN), and the
accuracy is measured on the held-out split.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from moco_ref.core.validation import require_count


@torch.no_grad()
def extract_features(model: nn.Module, images: torch.Tensor, batch_size: int = 512) -> np.ndarray:
    """``[N, F]`` float64 features: the first element of ``model(images)`` when it returns a
    tuple (LAB 07's ``(features, projection)``), else the output itself."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    batch_size = require_count("batch_size", batch_size)
    was_training = model.training
    model.eval()
    try:
        chunks = []
        for batch in images.split(batch_size):
            output = model(batch)
            if isinstance(output, (tuple, list)):
                output = output[0]
            chunks.append(output.reshape(len(batch), -1).double())
    finally:
        model.train(was_training)
    return torch.cat(chunks).numpy()


def linear_probe_accuracy(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    test_labels: np.ndarray,
    *,
    regularization: float = 1.0,
    max_iter: int = 2000,
) -> float:
    """Accuracy of a logistic regression on standardized features (``C = regularization``)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    _check_split(train_features, train_labels, test_features, test_labels)
    probe = make_pipeline(
        StandardScaler(), LogisticRegression(C=regularization, max_iter=max_iter)
    )
    probe.fit(train_features, train_labels)
    return float(probe.score(test_features, test_labels))


def knn_accuracy(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    test_labels: np.ndarray,
    *,
    k: int = 5,
) -> float:
    """Accuracy of a majority vote among the ``k`` nearest training features by cosine."""
    from sklearn.neighbors import KNeighborsClassifier

    _check_split(train_features, train_labels, test_features, test_labels)
    k = require_count("k", k)
    if k > len(train_labels):
        raise ValueError(f"k must not exceed the {len(train_labels)} training items, got {k}")
    knn = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute")
    knn.fit(train_features, train_labels)
    return float(knn.score(test_features, test_labels))


def probe_encoder(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    train: torch.Tensor,
    held_out: torch.Tensor,
    *,
    k: int = 5,
) -> dict[str, float]:
    """``{"linear": accuracy, "knn": accuracy}`` of ``model``'s frozen features, fitted on
    ``images[train]`` and scored on ``images[held_out]``."""
    features = extract_features(model, images)  # [N, F]
    labels_np = labels.numpy()
    train_np, held_np = train.numpy(), held_out.numpy()
    split = (features[train_np], labels_np[train_np], features[held_np], labels_np[held_np])
    return {"linear": linear_probe_accuracy(*split), "knn": knn_accuracy(*split, k=k)}


def _check_split(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    test_labels: np.ndarray,
) -> None:
    for name, features, labels in (
        ("train", train_features, train_labels),
        ("test", test_features, test_labels),
    ):
        if features.ndim != 2 or len(features) == 0 or len(features) != len(labels):
            raise ValueError(
                f"{name}_features must be [N, F] with one label each, got features "
                f"{list(features.shape)} and {len(labels)} labels"
            )
        if not np.isfinite(features).all():
            raise ValueError(f"{name}_features must be finite")
    if train_features.shape[1] != test_features.shape[1]:
        raise ValueError(
            f"train and test features differ in width: {train_features.shape[1]} vs "
            f"{test_features.shape[1]}"
        )
