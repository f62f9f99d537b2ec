"""The observing side: runs INSIDE the submission's process and records what its code does.

``observe(namespace, style, options)`` returns a dict made only of tensors, numbers, strings,
bools, None, lists and dicts (it crosses a process boundary through ``torch.save`` and
``torch.load(weights_only=True)``); what the submission returns is made so by the wall's lossy
conversion, ``probe.wall.WALL.sanitized``. Nothing here decides whether anything is right: the
record is judged in the grader's process (``judge``), by recomputation with the reference.

Whatever the submission raises is caught per part and recorded as a traceback string, so the
checks that need that part report it and the others still run.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from moco_ref.observe.builder_observer import observe_builder  # noqa: F401 - by name: ObservedStyle.observer
from moco_ref.observe.lab_probe import ProbeRecorder
from moco_ref.observe.tracebacks import submission_error_text
from moco_ref.probe.cases import (
    LabProbe,
    cases_fingerprint,
    component_cases,
    default_lab_probe,
    short_lab_probe,
)
from moco_ref.probe.lab import PROJECTION_DIM, flat_parameters, parameter_layout
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import INPUT_MUTATED
from moco_ref.probe.schema import (
    ComponentsRecord,
    EmaCaseOutput,
    LabRecord,
    LogitsCaseOutput,
    LossCaseOutput,
    QueueCaseOutput,
    Returned,
    TrainingRecord,
    WarmupRecord,
)
from moco_ref.probe.styles import COMPONENTS, OBSERVED_STYLES
from moco_ref.probe.threads import one_thread
from moco_ref.probe.wall import WALL

OBSERVATION_FORMAT = 1


def observe(namespace: dict, style: str, options: GradeOptions) -> dict:
    """Record what the submission (its module globals ``namespace``) does under the probe."""
    known = OBSERVED_STYLES.get(style)
    if known is None:
        record = {"unsupported": f"style {style!r} is not observed yet"}
    else:
        record = globals()[known.observer](namespace, options)
    record.update(format=OBSERVATION_FORMAT, style=style)
    return record


# --------------------------------------------------------------------------- helpers


def _describe(value) -> dict:
    """Type and shape of a returned value, for the return-contract check."""
    info = {"type": type(value).__name__}
    if isinstance(value, torch.Tensor):
        info.update(shape=list(value.shape), dtype=str(value.dtype).replace("torch.", ""))
    elif isinstance(value, nn.Module):
        info.update(module=True)
    elif isinstance(value, (list, tuple)):
        info.update(length=len(value))
    return info


def _call_warmup(namespace: dict) -> WarmupRecord:
    function = namespace.get("moco_warmup")
    if not callable(function):
        return {"defined": False, "error": "moco_warmup is not defined", "result": None}
    try:
        return {"defined": True, "error": None, "result": WALL.sanitized(function())}
    except BaseException as exc:  # noqa: BLE001 - any failure of the submission is data
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"defined": True, "error": submission_error_text(exc), "result": None}


# --------------------------------------------------------------------------- lab


def observe_lab(namespace: dict, options: GradeOptions,
                probe: LabProbe | None = None) -> LabRecord:
    """Run ``moco_warmup()`` and ``train_moco(initial, x, train, epochs)`` under the probe
    (``default_lab_probe(options.seed, options.probe_key)``, unless another is given, e.g.
    one drawn from ``cases.lab_probes``); the record names the probe."""
    probe = probe or default_lab_probe(options.seed, options.probe_key)
    with one_thread():
        record: LabRecord = {"probe": probe.to_dict(), "moco_warmup": _call_warmup(namespace)}
        record["train_moco"] = _observe_training(namespace, probe)
        if record["train_moco"].get("defined") and not record["train_moco"].get("error"):
            # the paths of a ring not yet full (cases.short_lab_probe)
            record["train_moco"]["short_run"] = _observe_training(
                namespace, short_lab_probe(probe), watch_input=True)
    return record


def _observe_training(namespace: dict, probe, watch_input: bool = False) -> TrainingRecord:
    function = namespace.get("train_moco")
    if not callable(function):
        return {"defined": False, "error": "train_moco is not defined"}
    recorder = ProbeRecorder(probe, module=str(namespace.get("__name__", "__main__")))
    for scope in _scopes(namespace, function):
        scope["views"] = recorder.handed_views
        scope["SEED"] = int(probe.seed)
    record: TrainingRecord = {
        "defined": True,
        "error": None,
        "layout": parameter_layout(recorder.initial),
        "initial_params": recorder.initial_params.clone(),
        "train": recorder.train.clone(),
        "projection_dim": PROJECTION_DIM,
    }
    pristine = recorder.images.clone() if watch_input else None
    started = time.perf_counter()
    try:
        result = function(recorder.initial, recorder.images, recorder.train.numpy(), probe.epochs)
    except BaseException as exc:  # noqa: BLE001 - the submission's failure is data
        if isinstance(exc, KeyboardInterrupt):
            raise
        record["error"] = submission_error_text(exc)
        result = None
    record["seconds"] = time.perf_counter() - started
    if pristine is not None and not torch.equal(recorder.images, pristine):
        record[INPUT_MUTATED] = True  # else set by the part's own watch (observe.parts)
    record["events"] = recorder.events
    record["dropped_events"] = recorder.dropped_events
    record["view_calls"] = [ids.clone() for ids in recorder.view_calls]
    record["instances"] = len(recorder.instances)
    record["initial_unchanged"] = bool(
        torch.equal(flat_parameters(recorder.initial), recorder.initial_params)
    )
    if record["error"] is None:
        try:
            record["returned"] = _returned(result, recorder)
        except Exception as exc:  # noqa: BLE001 - an unreadable return value is data too
            record["error"] = ("train_moco's return value could not be read:\n"
                               + submission_error_text(exc))
    return record


def _scopes(namespace: dict, function) -> list[dict]:
    """Where the submission looks ``views`` and ``SEED`` up: its namespace and, if that is a
    copy, the globals its function really reads."""
    scopes = [namespace]
    real = getattr(function, "__globals__", None)
    if isinstance(real, dict) and real is not namespace:
        scopes.append(real)
    return scopes


def _returned(result, recorder: ProbeRecorder) -> Returned:
    """What ``train_moco`` returned, described and converted to plain data."""
    info: Returned = {"type": type(result).__name__, "length": None, "items": []}
    if not isinstance(result, (tuple, list)):
        return info
    info["length"] = len(result)
    info["items"] = [_describe(item) for item in result[:WALL.lossy_items]]
    names = ("query", "key", "queue", "queue_ids", "history", "trace", "drift")
    values = dict(zip(names, result))
    for role in ("query", "key"):
        model = values.get(role)
        info[f"{role}_instance"] = recorder.tag_of(model)
        if isinstance(model, nn.Module):
            info[f"{role}_params"] = flat_parameters(model)
            info[f"{role}_grads_none"] = [p.grad is None for p in model.parameters()]
            info[f"{role}_requires_grad"] = [bool(p.requires_grad) for p in model.parameters()]
    for name in ("queue", "queue_ids", "history", "trace", "drift"):
        if name in values:
            info[name] = WALL.sanitized(values[name])
    drift = values.get("drift")
    if isinstance(drift, torch.Tensor) and drift.numel() == 1:
        info["drift"] = float(drift)
    return info


# --------------------------------------------------------------------------- components




def observe_components(namespace: dict, options: GradeOptions) -> ComponentsRecord:
    """Run each component of the protocol on the deterministic cases of ``strategies``.

    Only outputs are recorded, one entry per case (``{"error": traceback}`` when the case
    raised); the judge draws the same cases and builds the same inputs itself.
    """
    record: ComponentsRecord = {
        "seed": int(options.seed),
        "defined": {name: callable(namespace.get(name)) for name in COMPONENTS.entry_points},
        "moco_warmup": _call_warmup(namespace),
    }
    runners = {
        "queue": ("KeyQueue", _run_queue_case),
        "ema": ("momentum_update", _run_ema_case),
        "logits": ("contrastive_logits", _run_logits_case),
        "loss": ("info_nce_loss", _run_loss_case),
    }
    record["fingerprints"] = {}
    for kind, (name, runner) in runners.items():
        component = namespace.get(name)
        record["fingerprints"][kind] = cases_fingerprint(component_cases(kind, options.seed))
        record[kind] = _run_cases(component, runner, kind, options.seed) if callable(
            component) else None
    return record


def _run_cases(component, runner, kind: str, seed: int) -> list[dict]:
    outputs = []
    with one_thread():
        for case in component_cases(kind, seed):
            try:
                outputs.append(runner(component, case))
            except BaseException as exc:  # noqa: BLE001
                if isinstance(exc, KeyboardInterrupt):
                    raise
                outputs.append({"error": submission_error_text(exc)})
    return outputs


def _read(queue, name: str):
    value = getattr(queue, name)
    return value() if callable(value) else value


def _run_queue_case(KeyQueue, case) -> QueueCaseOutput:
    """Enqueue each batch, then scribble over the caller's tensors: a queue must have copied
    them. Record keys, ids and len after each enqueue."""
    queue = KeyQueue(case.capacity, case.dim, torch.float64)
    keys_after, ids_after, lengths = [], [], []
    for keys, ids in case.batches():
        queue.enqueue(keys, ids)
        keys.add_(case.SCRIBBLE)  # the caller reuses its buffers; stored entries must not change
        ids.add_(case.SCRIBBLE)
        keys = WALL.sanitized(torch.as_tensor(_read(queue, "keys")))
        keys_after.append(keys.to(torch.float64))
        ids_after.append(WALL.sanitized(torch.as_tensor(_read(queue, "ids"))).to(torch.int64))
        lengths.append(int(len(queue)))
    return {"keys": keys_after, "ids": ids_after, "len": lengths}


def _grad_of(tensor: torch.Tensor):
    """``tensor.grad`` without torch's warning about reading it on a non-leaf (a key
    parameter the EMA turned into one by building autograd history; I1 reports that)."""
    return tensor.grad if tensor.is_leaf or tensor.retains_grad else None


def _run_ema_case(momentum_update, case) -> EmaCaseOutput:
    key, query = case.models()
    query_before = [p.detach().clone() for p in query.parameters()]
    momentum_update(key, query, case.m)
    params = [p.detach().clone() for p in key.parameters()]
    return {
        "key_params": params,
        "key_buffers": [b.detach().clone() for b in key.buffers()],
        "key_grads_none": [_grad_of(p) is None for p in key.parameters()],
        "key_grad_fn": [p.grad_fn is not None for p in key.parameters()],
        "query_unchanged": all(
            torch.equal(p.detach(), before) for p, before in zip(query.parameters(), query_before)
        ),
    }


def _run_logits_case(contrastive_logits, case) -> LogitsCaseOutput:
    t = case.tensors()
    logits = contrastive_logits(
        t["q"], t["k"], t["queue_keys"], t["queue_ids"], t["ids"], case.temperature
    )
    return {"logits": WALL.sanitized(torch.as_tensor(logits)).to(torch.float64)}


def _run_loss_case(info_nce_loss, case) -> LossCaseOutput:
    t = case.tensors()
    if t["labels"] is None:
        loss = info_nce_loss(t["logits"])
    else:
        loss = info_nce_loss(t["logits"], t["labels"])
    value = float(loss) if not isinstance(loss, torch.Tensor) or loss.numel() == 1 else math.nan
    return {"loss": value}
