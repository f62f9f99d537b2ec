"""The ``lab`` probe's recorder: an instrumented model and a recording ``views``, run inside the
submission's process. What the probe *is* (its images, ids, model and views) is the contract,
``moco_ref.probe.lab``; this module records what happens to it.

``ProbeNet`` is a tiny float32 model with LAB 07's interface (``.encoder`` submodule,
``model(x) -> (features, 24-d projection)``). Every forward of it or of any deep copy of it
is recorded: which copy ran (copies are registered when ``copy.deepcopy`` makes them), which
images went in (traced back through the ``views`` recorder to their source ids), whether
autograd was on, the raw projection, a snapshot of every copy's parameters, and — through a
tensor hook — the gradient the loss sends back into the projection.

Everything recorded is a tensor, number, string, bool, None, list or dict.
"""

from __future__ import annotations

import torch
from torch import nn

from moco_ref.probe.cases import LabProbe
from moco_ref.probe.lab import (
    HANDED_NAME,
    MAX_EVENTS,
    MAX_SNAPSHOT_INSTANCES,
    LabProbeWorld,
    as_if_from,
    flat_parameters,
    net_class,
)
from moco_ref.probe.schema import ForwardEvent


def _flat_grads(module: nn.Module) -> torch.Tensor | None:
    """The ``.grad`` of every parameter as one float32 vector ``[P]`` (zeros where a
    parameter has none); None when no parameter has one."""
    params = list(module.parameters())
    if all(p.grad is None for p in params):
        return None
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach()
                      .reshape(-1).to(torch.float32) for p in params])


def _row_key(row: torch.Tensor) -> bytes:
    return row.detach().to(torch.float32).contiguous().reshape(-1).cpu().numpy().tobytes()


class ProbeRecorder(LabProbeWorld):
    """Everything the probe sees, in the order it happens."""

    def __init__(self, probe: LabProbe, module: str = "__main__") -> None:
        self._view_rows: dict[bytes, tuple[int, int]] = {}  # row bytes -> (call, id)
        self._view_outputs: list[torch.Tensor] = []  # [B, 64] per call, for inexact lookups
        self.view_calls: list[torch.Tensor] = []  # ids of each views() call
        self.instances: list[nn.Module] = []
        self._tags: dict[int, int] = {}
        self._last_forward: dict[int, int] = {}  # copy tag → clock of its latest forward
        self.events: list[ForwardEvent] = []
        self.dropped_events = 0
        self.clock = 0
        handed = net_class(HANDED_NAME, module, on_forward=self.on_forward, on_copy=self.register)
        super().__init__(probe, handed)
        self.handed_views = self._handed_views(module)
        rows = self.images.detach().to(torch.float32).reshape(len(self.images), -1).numpy()
        self._image_index = {row.tobytes(): i for i, row in enumerate(rows)}  # as _row_key
        self.register(self.initial)

    # ----------------------------------------------------------------- copies

    def register(self, module: nn.Module) -> int:
        if id(module) not in self._tags:
            self._tags[id(module)] = len(self.instances)
            self.instances.append(module)  # kept alive, so ids are never reused
        return self._tags[id(module)]

    def _snapshot_tags(self, tag: int) -> list[int]:
        """The copies snapshotted at a forward: the initial model, the one forwarding, the
        ones that forwarded most recently (a key encoder replaced every step stays followed),
        then the newest made."""
        chosen = {0, tag}
        recent = sorted(self._last_forward, key=self._last_forward.get, reverse=True)
        for t in [*recent, *range(len(self.instances) - 1, -1, -1)]:
            if len(chosen) >= MAX_SNAPSHOT_INSTANCES:
                break
            chosen.add(t)
        return sorted(chosen)

    def tag_of(self, obj: object) -> int:
        return self._tags.get(id(obj), -1)

    # ----------------------------------------------------------------- views

    def _handed_views(self, module: str):
        """``views`` as the submission meets it: a plain function of its own module, as a
        notebook's would be (the recorder only in its closure)."""
        record = self.views

        def views(batch):
            return record(batch)

        return as_if_from(views, module, "views")

    def views(self, batch: torch.Tensor) -> torch.Tensor:
        """The probe's augmentation: the images plus seeded noise, unique per call and row."""
        batch = torch.as_tensor(batch)
        ids = self._ids_of_images(batch)
        call = len(self.view_calls)
        out = self.view(call, batch)
        for row, source in zip(out, ids.tolist()):
            self._view_rows[_row_key(row)] = (call, source)
        self._view_outputs.append(out.reshape(len(out), -1).clone())
        self.view_calls.append(ids)
        return out

    def _ids_of_images(self, batch: torch.Tensor) -> torch.Tensor:
        ids = [self._image_index.get(_row_key(row), -1) for row in batch]
        missing = [i for i, source in enumerate(ids) if source < 0]
        if missing:  # converted or copied inexactly: nearest image, if it is close
            rows = batch[missing].detach().to(torch.float32).reshape(len(missing), -1)
            distance = torch.cdist(rows, self.images.reshape(len(self.images), -1))
            best, index = distance.min(dim=1)
            for slot, d, i in zip(missing, best.tolist(), index.tolist()):
                ids[slot] = i if d < 1e-3 else -1
        return torch.tensor(ids, dtype=torch.int64)

    def _sources_of_inputs(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(view call [B], source id [B])`` of each input row; call −1 for a raw image,
        −2 (and id −1) when the row cannot be traced."""
        calls, ids = [], []
        rows = images.detach().to(torch.float32).reshape(len(images), -1)
        for row in rows:
            key = _row_key(row)
            if key in self._view_rows:
                call, source = self._view_rows[key]
            elif key in self._image_index:
                call, source = -1, self._image_index[key]
            else:
                call, source = -2, -1
            calls.append(call)
            ids.append(source)
        untraced = [i for i, c in enumerate(calls) if c == -2]
        if untraced and self._view_outputs:
            outputs = torch.cat(self._view_outputs)  # [V, 64]
            owners = [(c, j) for c, out in enumerate(self._view_outputs) for j in range(len(out))]
            distance = torch.cdist(rows[untraced], outputs)
            best, index = distance.min(dim=1)
            for slot, d, i in zip(untraced, best.tolist(), index.tolist()):
                if d < 1e-3:
                    call, row_index = owners[i]
                    calls[slot], ids[slot] = call, int(self.view_calls[call][row_index])
        return torch.tensor(calls, dtype=torch.int64), torch.tensor(ids, dtype=torch.int64)

    # ----------------------------------------------------------------- forwards

    def on_forward(self, module: nn.Module, images: torch.Tensor, projection: torch.Tensor) -> None:
        self.clock += 1
        if len(self.events) >= MAX_EVENTS:
            self.dropped_events += 1
            return
        tag = self.register(module)
        self._last_forward[tag] = self.clock
        calls, ids = self._sources_of_inputs(images)
        snapshot_tags = self._snapshot_tags(tag)
        event: ForwardEvent = {
            "instance": tag,
            "clock": self.clock,
            "view_calls": len(self.view_calls),
            "rows_call": calls,
            "rows_id": ids,
            "grad_enabled": torch.is_grad_enabled(),
            "output_requires_grad": bool(projection.requires_grad),
            "output_has_grad_fn": projection.grad_fn is not None,
            "output": projection.detach().to(torch.float32).clone(),  # [B, 24]
            "snapshot_tags": snapshot_tags,
            "params": [flat_parameters(self.instances[t]) for t in snapshot_tags],
            "has_grad": [
                any(p.grad is not None for p in self.instances[t].parameters())
                for t in snapshot_tags
            ],
            "grad": None,
            "grad_clock": -1,
            "grad_calls": 0,
            "own_grad": _flat_grads(module),
        }
        self.events.append(event)
        if projection.requires_grad:
            projection.register_hook(self._grad_hook(event))

    def _grad_hook(self, event: ForwardEvent):
        def hook(grad: torch.Tensor) -> None:
            grad = grad.detach().to(torch.float32).clone()
            event["grad"] = grad if event["grad"] is None else event["grad"] + grad
            event["grad_calls"] += 1
            if event["grad_clock"] < 0:
                self.clock += 1
                event["grad_clock"] = self.clock

        return hook
