"""The ``builder`` module at its constructor's own defaults: ``MoCo(base_encoder)`` (plus the
course's declared keyword arguments), trained ``DEFAULTS_STEPS`` steps of the probe's batch
by the official loop. The main runs build the module with the probe's small K and dim; a module
that behaves one way at those and another at the sizes a course really uses (an EMA or an
enqueue that runs only while K is small) shows here.

The queue at the defaults is large (65536 × 128 for the official module), so a step keeps only
what the EMA and the enqueue need: both encoders' parameters as each step begins, the key
encoder's outputs, the pointer and how many columns changed. Nothing here judges.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from moco_ref.observe.builder_probe import (
    CONSTRUCTOR_EXTRAS,
    BuilderRecorder,
    buffer_copy,
    cross_entropy_calls,
    describe_value,
    parameters_of,
    returned_pairs,
)
from moco_ref.observe.tracebacks import submission_error_text
from moco_ref.probe.builder import BuilderProbe, probe_images
from moco_ref.probe.schema import DefaultsRun, DefaultsStep

DEFAULTS_STEPS = 4  # step 0 starts from θk = θq: the EMA shows from step 1 on
DEFAULTED = ("dim", "K", "m", "T")


def constructor_defaults(moco_class) -> dict:
    """The numeric defaults of ``dim``, ``K``, ``m`` and ``T`` in the constructor's signature."""
    try:
        parameters = inspect.signature(moco_class).parameters
    except (TypeError, ValueError):
        return {}
    found = {}
    for name in DEFAULTED:
        default = getattr(parameters.get(name), "default", inspect.Parameter.empty)
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            found[name] = float(default)
    return found


def run_at_defaults(moco_class, probe: BuilderProbe) -> DefaultsRun:
    """Build ``moco_class`` at its defaults and train it a few steps (see the module)."""
    recorder = BuilderRecorder(probe)
    run: DefaultsRun = {"error": None, "stage": "construct", "steps": [], "batch": probe.batch,
                        "defaults": constructor_defaults(moco_class)}
    torch.manual_seed(probe.seed)
    try:
        model = moco_class(recorder.base_encoder, **CONSTRUCTOR_EXTRAS)
        recorder.follow(model)
        queue = _columns(model, run["defaults"])
        if queue is None:
            raise TypeError("the module built at its defaults has no queue buffer [dim, K]")
        run["dim"], run["K"] = (int(size) for size in queue.shape)
        run["stage"] = "optimizer"
        optimizer = torch.optim.SGD(model.parameters(), lr=probe.lr)
    except BaseException as exc:  # noqa: BLE001 - the submission's failure is data
        if isinstance(exc, KeyboardInterrupt):
            raise
        run["error"] = submission_error_text(exc)
        return run
    for t in range(DEFAULTS_STEPS):
        run["stage"] = f"step {t}"
        try:
            run["steps"].append(_step(model, optimizer, recorder, *probe_images(probe, t),
                                      run["defaults"]))
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            run["error"] = submission_error_text(exc)
            return run
    run["stage"] = "done"
    return run


def _columns(model, defaults: dict) -> torch.Tensor | None:
    """The queue as ``[dim, K]`` (one key per column, the official layout; a ``[K, dim]``
    queue, recognised by the declared defaults, is read transposed)."""
    queue = getattr(model, "queue", None)
    if not isinstance(queue, torch.Tensor) or queue.ndim != 2:
        return None
    rows, cols = queue.shape
    if (rows, cols) == (defaults.get("K"), defaults.get("dim")) and rows != cols:
        return queue.T
    return queue


def _pointer(model) -> int | None:
    value = buffer_copy(model, "queue_ptr")
    return int(value.reshape(-1)[0]) if value is not None and value.numel() else None


def _step(model, optimizer, recorder: BuilderRecorder, im_q: torch.Tensor,
          im_k: torch.Tensor, defaults: dict) -> DefaultsStep:
    before = _columns(model, defaults).detach().clone()  # [dim, K]
    ptr = _pointer(model)
    params = parameters_of(model)
    recorder.begin_step(im_q, im_k)
    captured: list = []
    try:
        with cross_entropy_calls(captured):
            output = model(im_q, im_k)
    finally:
        events = recorder.end_step()
    keys = [event for event in events if event["role"] == "k"]
    after = _columns(model, defaults).detach()  # [dim, K]
    changed = int((after != before).any(dim=0).sum()) if after.shape == before.shape \
        else after.shape[1]
    step: DefaultsStep = {
        "params_q": params["params_q"], "params_k": params["params_k"],
        "keys": torch.cat([event["output"] for event in keys]) if keys else None,
        "ptr_before": ptr, "changed_count": changed,
    }
    pairs, returned_loss = returned_pairs(output, captured, describe_value(output))
    loss = returned_loss if returned_loss is not None else sum(
        F.cross_entropy(logits, labels) for logits, labels in pairs)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return step
