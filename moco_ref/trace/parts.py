"""What the user names of their own MoCo: the encoders, where the dictionary lives, T and m.

The user's code is trusted and unchanged; ``MoCoParts`` only says where to look. Each part is
read through one small accessor here, so the recorder never guesses at a library's shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from moco_ref.trace.layouts import LAYOUTS

EMA_WRAPPER_ATTRIBUTES = ("module", "ema_model", "model")  # mmengine / timm / torch.optim.swa_utils


Encoder = nn.Module | Sequence[nn.Module]


@dataclass
class MoCoParts:
    """Where the user's MoCo keeps each part.

    ``query``/``key``: the module whose forward output is q (resp. k); a tuple output gives
    its first tensor. A pair ``(backbone, neck)`` takes the input of the first and the output
    of the last. ``key`` may be an EMA wrapper (its ``.module`` holds the parameters).
    ``queue``: a tensor, or a zero-argument callable returning the current dictionary, in
    ``layout``. ``pointer``: the ring's write position (tensor, int or callable), optional.
    ``temperature``/``momentum``: when known; a check that needs one not given says so.
    """

    query: Encoder
    key: Encoder
    queue: torch.Tensor | Callable[[], torch.Tensor] | None = None
    layout: str = "dim-first"
    pointer: torch.Tensor | int | Callable[[], object] | None = None
    temperature: float | None = None
    momentum: float | None = None
    from_start: bool = True  # the recording starts where training starts (θk a copy of θq)
    # where the views arrive in image order: a module (its forward) or (object, method name),
    # e.g. (model, "training_step"); its tensor arguments with one row per image, in order,
    # are the views (im_q, im_k, …). Needed when the key encoder sees a shuffled batch
    views: nn.Module | tuple[object, str] | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {self.layout!r}")
        for name in ("query", "key"):
            if not _modules(getattr(self, name)):
                raise TypeError(f"MoCoParts.{name} must be an nn.Module or a sequence of them, "
                                f"not {type(getattr(self, name)).__name__}")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, not {self.temperature}")
        if self.views is not None and not isinstance(self.views, nn.Module) and not (
                isinstance(self.views, tuple) and len(self.views) == 2 and isinstance(
                    self.views[1], str) and callable(getattr(self.views[0], self.views[1],
                                                             None))):
            raise TypeError("MoCoParts.views must be an nn.Module or (object, method name)")
        if self.momentum is not None and not 0 <= self.momentum <= 1:
            raise ValueError(f"momentum must be in [0, 1], not {self.momentum}")

    # ------------------------------------------------------------------ encoders

    def modules(self, role: str) -> list[nn.Module]:
        """The modules whose forwards are the encoder's (first: input, last: output)."""
        return _modules(self.query if role == "q" else self.key)

    def parameters(self, role: str) -> list[tuple[str, nn.Parameter]]:
        """The encoder's named parameters, an EMA wrapper unwrapped."""
        named: list[tuple[str, nn.Parameter]] = []
        for i, module in enumerate(self.modules(role)):
            prefix = f"{i}." if len(self.modules(role)) > 1 else ""
            named += [(prefix + name, p) for name, p in unwrap_ema(module).named_parameters()]
        return named

    # ------------------------------------------------------------------ dictionary

    def read_queue(self) -> torch.Tensor | None:
        value = self.queue() if callable(self.queue) and not isinstance(
            self.queue, torch.Tensor) else self.queue
        if value is None:
            return None
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"MoCoParts.queue gave a {type(value).__name__}, not a tensor")
        return value.detach().to("cpu", copy=True)

    def read_pointer(self) -> torch.Tensor | None:
        value = self.pointer() if callable(self.pointer) and not isinstance(
            self.pointer, torch.Tensor) else self.pointer
        if value is None:
            return None
        if isinstance(value, torch.Tensor):
            return value.detach().to("cpu", copy=True).reshape(-1)[:1].to(torch.int64)
        return torch.tensor([int(value)])


def unwrap_ema(module: nn.Module) -> nn.Module:
    """The averaged copy an EMA wrapper holds (mmengine's ``ExponentialMovingAverage``,
    timm's ``ModelEmaV2``, ``torch.optim.swa_utils.AveragedModel``), else the module."""
    for name in EMA_WRAPPER_ATTRIBUTES:
        inner = getattr(module, name, None)
        if isinstance(inner, nn.Module) and inner is not module:
            own = {id(p) for p in module.parameters()}
            if own == {id(p) for p in inner.parameters()}:
                return inner
    return module


def _modules(value) -> list[nn.Module]:
    if isinstance(value, nn.Module):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, nn.Module)
                                                           for m in value):
        return list(value)
    return []
