"""``moco-ref export CKPT --out backbone.pth [--arch resnet50]``: a MoCo checkpoint's query
backbone for linear classification (``moco_ref.tools.checkpoint``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write a MoCo checkpoint's encoder_q backbone (no head) for a classifier",
        description="Strip 'module.encoder_q.' from a MoCo checkpoint (official layout or "
                    "moco_ref.MoCo's), drop the head (fc), verify a strict load into the "
                    "torchvision architecture without its head, and save the state dict.")
    parser.add_argument("checkpoint", metavar="CKPT", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="where the backbone goes")
    parser.add_argument("--arch", default=None,
                        help="torchvision architecture (default: the checkpoint's 'arch')")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from moco_ref.tools.checkpoint import CheckpointError, export_backbone

    try:
        arch, count = export_backbone(args.checkpoint, args.out, args.arch)
    except CheckpointError as exc:
        print(f"moco-ref: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {count} tensors of {arch} without its head (loads strictly)")
    return 0
