"""``moco-ref train``: train a MoCo encoder with LAB 07's loop, probe it, write the results.

Writes ``OUT/metrics.json`` (loss history, linear-probe and kNN accuracy of the encoder at
random init and after training, hyperparameters, versions, wall time) and
``OUT/training.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from moco_ref.core.orders import ORDERS
from moco_ref.tools.recipes import RECIPES, Recipe, positive_int

HELD_OUT_FRACTION = 0.3


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a small MoCo encoder (LAB 07's loop) and probe its frozen features",
        description="Train a MoCo encoder with LAB 07's loop (on the reference trainer), "
                    "probe its frozen features against the same encoder at random init, and "
                    "write OUT/metrics.json and OUT/training.png.",
    )
    parser.add_argument(
        "--data", default=None,
        help="a .npz with 'images' and 'labels', an ImageFolder root, or a CIFAR-10 root "
             "already on disk (default: scikit-learn's bundled 8x8 digits)",
    )
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="default",
                        help="default: this project's digits recipe; lab07: LAB 07's "
                             "hyperparameters (m .95, K 240, batch 60, Adam .002, T .2, 15 epochs)")
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help="override the recipe's number of epochs")
    parser.add_argument("--order", choices=ORDERS, default="lab",
                        help="step order: paper (Algorithm 1) or lab (LAB 07 / official code)")
    parser.add_argument("--out", type=Path, default=Path("moco-train"),
                        help="output folder (default: ./moco-train)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="use at most this many images (stratified)")
    parser.add_argument("--image-size", type=positive_int, default=32,
                        help="side length images of an image folder are resized to")
    parser.add_argument("--knn-k", type=positive_int, default=5,
                        help="neighbours in the cosine kNN probe")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch CPU threads (default 1: faster than 2 for these tiny "
                             "convolutions on a 2-core machine)")
    parser.set_defaults(run=run_train)


def run_train(args: argparse.Namespace) -> int:
    from moco_ref.tools.data import DataError

    try:
        metrics = train_and_probe(args)
    except (DataError, FileNotFoundError) as error:
        print(f"moco-ref train: error: {error}", file=sys.stderr)
        return 2
    from moco_ref.tools.training_figure import save_training_figure

    args.out.mkdir(parents=True, exist_ok=True)
    metrics_path = args.out / "metrics.json"
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    figure_path = save_training_figure(metrics, args.out / "training.png")
    probe = metrics["probe"]
    print(
        f"loss {metrics['history'][0]:.3f} -> {metrics['history'][-1]:.3f}; "
        f"linear probe {probe['random_init']['linear']:.3f} (random init) -> "
        f"{probe['trained']['linear']:.3f} (trained); "
        f"kNN {probe['random_init']['knn']:.3f} -> {probe['trained']['knn']:.3f}; "
        f"{metrics['wall_seconds']:.1f} s"
    )
    print(f"wrote {metrics_path} and {figure_path}")
    return 0


def train_and_probe(args: argparse.Namespace) -> dict:
    """The run behind ``moco-ref train``, with torch limited to ``args.threads`` threads."""
    import torch

    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _train_and_probe(args)
    finally:
        torch.set_num_threads(threads_before)


def _train_and_probe(args: argparse.Namespace) -> dict:
    import torch

    from moco_ref.core.lab import train_moco
    from moco_ref.core.views import AugmentationStrength, make_views
    from moco_ref.tools.data import load_dataset, stratified_split, stratified_subset
    from moco_ref.tools.evaluation import probe_encoder
    from moco_ref.tools.models import SmallConvNet

    started = time.perf_counter()
    recipe: Recipe = RECIPES[args.recipe]
    epochs = recipe.epochs if args.epochs is None else args.epochs
    data = load_dataset(args.data, image_size=args.image_size)
    if args.limit is not None:
        data = data.subset(stratified_subset(data.labels, args.limit, seed=args.seed))
    train, held_out = stratified_split(data.labels, HELD_OUT_FRACTION, seed=args.seed)

    torch.manual_seed(args.seed)
    initial = SmallConvNet(data.channels, **recipe.model)
    probe_at_init = probe_encoder(initial, data.images, data.labels, train, held_out,
                                  k=args.knn_k)
    views = make_views(args.seed + 1, image_size=data.image_size,
                       strength=AugmentationStrength(**recipe.augmentation))
    training_started = time.perf_counter()
    with _EpochBar(epochs, recipe.capacity) as bar:
        query, _, queue, _, history, trace, drift = train_moco(
            initial, data.images, train, epochs, order=args.order, m=recipe.m,
            temperature=recipe.temperature, capacity=recipe.capacity,
            batch_size=recipe.batch_size, lr=recipe.lr, seed=args.seed, views=views,
            on_epoch_end=bar.update,
        )
    training_seconds = time.perf_counter() - training_started
    probe_trained = probe_encoder(query, data.images, data.labels, train, held_out,
                                  k=args.knn_k)
    return {
        "recipe": recipe.name,
        "order": args.order,
        "seed": args.seed,
        "data": {**data.summary(), "train_items": len(train), "held_out_items": len(held_out)},
        "hyperparameters": {
            **recipe.to_dict(), "epochs": epochs, "held_out_fraction": HELD_OUT_FRACTION,
            "knn_k": args.knn_k, "threads": args.threads,
        },
        "history": history,
        "probe": {"random_init": probe_at_init, "trained": probe_trained},
        "trace": trace,
        "drift": drift,
        "queue": {"size": len(queue), "capacity": recipe.capacity},
        "versions": _versions(),
        "training_seconds": training_seconds,
        "wall_seconds": time.perf_counter() - started,
    }


class _EpochBar:
    """A tqdm bar that advances once per epoch and shows the epoch's loss and queue fill."""

    def __init__(self, epochs: int, capacity: int) -> None:
        from tqdm import tqdm

        self.capacity = capacity
        self.bar = tqdm(total=epochs, unit="epoch", desc="MoCo", file=sys.stderr)

    def update(self, epoch: int, mean_loss: float, queue_size: int) -> None:
        self.bar.set_postfix(loss=f"{mean_loss:.3f}", queue=f"{queue_size}/{self.capacity}")
        self.bar.update(1)

    def __enter__(self) -> _EpochBar:
        return self

    def __exit__(self, *exc_info) -> None:
        self.bar.close()


def _versions() -> dict:
    import numpy
    import sklearn
    import torch
    import torchvision

    from moco_ref import __version__

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "numpy": numpy.__version__,
        "sklearn": sklearn.__version__,
        "moco_ref": __version__,
    }
