"""MoCo on N CPU processes: the digits recipe with ``moco_ref.MoCo`` under
DistributedDataParallel, shuffle-BN and a queue gathered from all ranks.

    torchrun --nproc_per_node 2 -m moco_ref.tools.train_dist --epochs 3 --out runs/dist
    moco-ref train --nproc 2 ...            (the same, launched for you)

Without torchrun's environment it runs in one process. Rank 0 probes the trained encoder
and writes ``OUT/metrics.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from moco_ref.core.builder import MoCo
from moco_ref.core.distributed import rank, world_size
from moco_ref.tools.recipes import RECIPES, positive_int


class _Projection(nn.Module):
    """A LAB model seen as a ``base_encoder``: ``forward`` returns the projection only."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[1]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m moco_ref.tools.train_dist")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="default")
    parser.add_argument("--epochs", type=positive_int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/dist"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from moco_ref.core.views import AugmentationStrength, make_views
    from moco_ref.tools.data import load_digits_dataset, stratified_split
    from moco_ref.tools.evaluation import probe_encoder
    from moco_ref.tools.models import SmallConvNet

    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    torch.set_num_threads(1 if world_size() > 1 else torch.get_num_threads())
    recipe = RECIPES[args.recipe]
    epochs = args.epochs or recipe.epochs
    per_rank = max(1, recipe.batch_size // world_size())
    data = load_digits_dataset()
    train, held_out = stratified_split(data.labels, seed=args.seed)

    def base_encoder(num_classes: int) -> nn.Module:
        spec = {**recipe.model, "projection_dim": num_classes}
        return _Projection(SmallConvNet(data.channels, **spec))

    torch.manual_seed(args.seed)  # every rank builds the same initial model and queue
    model = MoCo(base_encoder, dim=recipe.model.get("projection_dim", 24), K=recipe.capacity,
                 m=recipe.m, T=recipe.temperature)
    state = model.encoder_q.model.encoder.state_dict()
    initial = {name: value.clone() for name, value in state.items()}  # a snapshot, not a view
    trained = nn.parallel.DistributedDataParallel(model) if world_size() > 1 else model
    optimizer = torch.optim.Adam(model.encoder_q.parameters(), lr=recipe.lr)
    views = make_views(args.seed + 1 + rank(), image_size=data.image_size,
                       strength=AugmentationStrength(**recipe.augmentation))
    shuffler = torch.Generator().manual_seed(args.seed)  # the same order on every rank
    global_batch = per_rank * world_size()
    history, started = [], time.monotonic()
    for epoch in range(epochs):
        order = train[torch.randperm(len(train), generator=shuffler)]
        usable = len(order) - len(order) % global_batch  # equal batches for all_gather
        losses = []
        for batch in order[:usable].view(-1, world_size(), per_rank):
            ids = batch[rank()]  # [per_rank]
            images = data.images[ids]
            logits, labels = trained(views(images), views(images), ids=ids)
            loss = nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        history.append(sum(losses) / len(losses))
        if rank() == 0:
            print(f"epoch {epoch + 1}/{epochs}: loss {history[-1]:.4f}", flush=True)
    if rank() == 0:
        encoder = model.encoder_q.model
        fresh = SmallConvNet(data.channels, **recipe.model)
        fresh.encoder.load_state_dict(initial)
        metrics = {
            "world_size": world_size(), "history": history,
            "probe": {"random_init": probe_encoder(fresh, data.images, data.labels, train,
                                                   held_out),
                      "trained": probe_encoder(encoder, data.images, data.labels, train,
                                               held_out)},
            "hyperparameters": {**recipe.to_dict(), "epochs": epochs,
                                "batch_per_rank": per_rank},
            "wall_seconds": time.monotonic() - started,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2))
        print(json.dumps(metrics["probe"]))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
