"""The EMA law of the key encoder (invariant I7), in exactly one place.

    θk ← m·θk + (1 − m)·θq        over parameters, not buffers

It is written as ``θk.lerp_(θq, 1 − m)``, i.e. ``θk + (1 − m)·(θq − θk)``: when θk already
equals θq the update is an exact no-op, which is what makes the paper order and the LAB
order bitwise identical (DESIGN, I6).
"""

from __future__ import annotations

import torch
from torch import nn

from moco_ref.core.validation import require_probability


def matched_parameters(
    key_model: nn.Module, query_model: nn.Module
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The two models' parameters, pairwise, after checking that they correspond."""
    for name, model in (("key_model", key_model), ("query_model", query_model)):
        if not isinstance(model, nn.Module):
            raise TypeError(f"{name} must be a torch.nn.Module, got {type(model).__name__}")
    key_named = list(key_model.named_parameters())
    query_named = list(query_model.named_parameters())
    if len(key_named) != len(query_named):
        raise ValueError(
            "key_model and query_model must have matching parameters: "
            f"key_model has {len(key_named)}, query_model has {len(query_named)}"
        )
    for (key_name, key_param), (query_name, query_param) in zip(key_named, query_named):
        if key_param.shape != query_param.shape or key_param.dtype != query_param.dtype:
            raise ValueError(
                "key_model and query_model must have matching parameters: "
                f"key {key_name!r} is {list(key_param.shape)} {key_param.dtype}, "
                f"query {query_name!r} is {list(query_param.shape)} {query_param.dtype}"
            )
    return [p for _, p in key_named], [p for _, p in query_named]


def momentum_update(key_model: nn.Module, query_model: nn.Module, m: float) -> None:
    """Move every key parameter toward its query twin: θk ← m·θk + (1 − m)·θq, in place.

    Buffers (e.g. BatchNorm running statistics) are left alone; no autograd history is
    recorded. ``m`` must lie in [0, 1]: ``m = 1`` freezes the key encoder, ``m = 0`` copies
    the query encoder.
    """
    m = require_probability("m", m)
    key_params, query_params = matched_parameters(key_model, query_model)
    if key_params:
        with torch.no_grad():
            torch._foreach_lerp_(key_params, query_params, 1.0 - m)
