"""A MoCo checkpoint's query backbone, for linear classification: the official training
script saves ``{"arch", "state_dict": {"module.encoder_q.…", …}}``; the official linear
script keeps ``encoder_q``'s weights but its head (``fc``). ``export_backbone`` does that,
and proves it by a strict load into the torchvision architecture without its head.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

QUERY_PREFIXES = ("module.encoder_q.", "encoder_q.")  # DDP-wrapped, or not


class CheckpointError(ValueError):
    """A checkpoint that cannot be exported, said in one line."""


def query_backbone(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``encoder_q``'s parameters and buffers without the prefix and without the head
    (``fc.*``: the projection, or MoCo v2's MLP)."""
    backbone = {}
    for name, value in state_dict.items():
        prefix = next((p for p in QUERY_PREFIXES if name.startswith(p)), None)
        if prefix is None:
            continue
        inner = name[len(prefix):]
        if not inner.startswith("fc."):
            backbone[inner] = value
    if not backbone:
        raise CheckpointError("no encoder_q weights in the checkpoint (expected keys like "
                              "'module.encoder_q.conv1.weight')")
    return backbone


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], str | None]:
    """``(state_dict, arch)`` of a checkpoint file: ``{"state_dict": …, "arch": …}`` as the
    official script saves it, or a bare state dict."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except Exception as exc:  # noqa: BLE001 - a corrupt file, or one torch cannot read safely
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(exc).__name__})") from None
    if isinstance(data, dict) and isinstance(data.get("state_dict"), dict):
        return data["state_dict"], data.get("arch")
    if isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values()):
        return data, None
    raise CheckpointError(f"{path}: neither a state dict nor {{'state_dict': …}}")


def headless(arch: str) -> nn.Module:
    """The torchvision architecture ``arch`` with its ``fc`` replaced by the identity."""
    import torchvision.models as models

    factory = getattr(models, arch, None)
    if not callable(factory) or arch.startswith("_"):
        raise CheckpointError(f"--arch {arch!r} is not a torchvision model (e.g. resnet50)")
    model = factory(weights=None)
    if not isinstance(getattr(model, "fc", None), nn.Module):
        raise CheckpointError(f"{arch} has no fc head to drop")
    model.fc = nn.Identity()
    return model


def export_backbone(checkpoint: Path, out: Path, arch: str | None = None) -> tuple[str, int]:
    """Write ``encoder_q``'s backbone of ``checkpoint`` to ``out`` after a strict load into
    ``arch`` (the checkpoint's own when not given); ``(arch, number of tensors)``."""
    state_dict, saved_arch = load_checkpoint(checkpoint)
    arch = arch or saved_arch
    if not arch:
        raise CheckpointError(f"{checkpoint}: no 'arch' saved in it; give --arch (e.g. resnet50)")
    backbone = query_backbone(state_dict)
    model = headless(arch)
    try:
        model.load_state_dict(backbone, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise CheckpointError(f"encoder_q does not load strictly into {arch} without its head: "
                              f"{' '.join(line.strip() for line in first[:3])[:300]}") from None
    torch.save(backbone, out)
    return arch, len(backbone)
