"""Argument checks shared by the reference API.

Every public function of the reference validates its input here, so that bad input
fails early with a message that names the argument and what was expected.
"""

from __future__ import annotations

import math
from numbers import Real

import torch


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_matrix(name: str, value: object, *, dim: int | None = None,
                   finite: bool = True) -> torch.Tensor:
    """A floating-point tensor of shape [rows, dim] with finite entries (not scanned for them
    when ``finite`` is False: the caller knows)."""
    tensor = require_tensor(name, value)
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")
    if tensor.ndim != 2:
        raise ValueError(f"{name} must have shape [rows, dim], got shape {list(tensor.shape)}")
    if dim is not None and tensor.shape[1] != dim:
        raise ValueError(
            f"{name} must have {dim} columns (the feature dimension), "
            f"got shape {list(tensor.shape)}"
        )
    if finite and tensor.numel() and not all_finite(tensor):
        bad = (~torch.isfinite(tensor.detach())).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"{name} must be finite; rows {bad[:8]} contain NaN or inf")
    return tensor


def all_finite(tensor: torch.Tensor) -> bool:
    """No NaN and no ±inf; one fused min/max pass (NaN propagates into both), which is much
    cheaper than materialising ``isfinite`` for a large queue."""
    tensor = tensor.detach()
    if not tensor.is_contiguous() and tensor.ndim == 2 and tensor.T.is_contiguous():
        tensor = tensor.T  # e.g. a [dim, K] buffer read as [K, dim]: no copy of the queue
    low, high = torch.aminmax(tensor)
    return math.isfinite(float(low)) and math.isfinite(float(high))


def require_ids(name: str, value: object, *, length: int | None = None) -> torch.Tensor:
    """A one-dimensional integer tensor (or sequence of ints), returned as int64."""
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{name} must be a 1-d tensor of integer ids: {error}") from None
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        raise TypeError(f"{name} must hold integer ids (int64), got dtype {value.dtype}")
    if value.ndim != 1:
        raise ValueError(f"{name} must have shape [B], got shape {list(value.shape)}")
    if length is not None and value.shape[0] != length:
        raise ValueError(
            f"{name} must have one id per key: expected {length} ids, got {value.shape[0]}"
        )
    return value.to(torch.int64)


def require_probability(name: str, value: object) -> float:
    """A real number in [0, 1] (a momentum or an interpolation weight)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number in [0, 1], got {type(value).__name__}")
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return value


def require_positive(name: str, value: object) -> float:
    """A finite real number > 0 (a temperature)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a positive real number, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def require_count(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def require_same_rows(names: tuple[str, str], first: torch.Tensor, second: torch.Tensor) -> None:
    if first.shape != second.shape:
        raise ValueError(
            f"{names[0]} and {names[1]} must have the same shape, "
            f"got {list(first.shape)} and {list(second.shape)}"
        )
