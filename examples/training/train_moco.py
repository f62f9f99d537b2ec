"""Train the small MoCo of moco_model.py with a loop of its own, on random images.

    python train_moco.py --epochs 2

Record its first steps with moco-ref (the script is not changed):

    moco-ref trace check --attach moco_model:MoCoModel --query encoder_q --key encoder_k \
        --queue queue --pointer queue_ptr --views forward --temperature 0.2 --momentum 0.99 \
        -- train_moco.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from moco_model import MoCoModel
from torch.utils.data import DataLoader, TensorDataset


def two_views(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random augmentations: noise and a random horizontal flip per image."""
    def augment(x: torch.Tensor) -> torch.Tensor:
        flip = torch.rand(len(x)) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return x + 0.1 * torch.randn_like(x)
    return augment(images), augment(images)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    torch.manual_seed(0)
    images = torch.rand(256, 3, 8, 8)
    loader = DataLoader(TensorDataset(images), batch_size=args.batch_size, shuffle=True,
                        drop_last=True)
    model = MoCoModel()
    optimizer = torch.optim.SGD(model.encoder_q.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        total = 0.0
        for (batch,) in loader:
            im_q, im_k = two_views(batch)
            logits, labels = model(im_q, im_k)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model.momentum_update()
            total += loss.item()
        print(f"epoch {epoch}: loss {total / len(loader):.4f}")


if __name__ == "__main__":
    main()
