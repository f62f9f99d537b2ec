"""Validation of a ``builder`` record (the main, mlp, ragged and two-process runs): its
structure, and every recorded forward of the intact probe encoder recomputed from the
parameters recorded with it on the probe's own images (see ``record``)."""

from __future__ import annotations

import torch

from moco_ref.judge.record import (
    boolean,
    entries,
    in_time,
    integer,
    need,
    tensor_of,
    text_or_none,
)
from moco_ref.probe import schema
from moco_ref.probe.builder import ENCODER_NAMES
from moco_ref.probe.options import GradeOptions

BUILDER_FORWARD_TOLERANCE = 1e-4  # relative to max(1, the largest output)


def validate_builder_part(name: str, data, meta: dict, options: GradeOptions) -> None:
    _builder(data, options)

def _builder(data, options: GradeOptions) -> None:
    entries(data, schema.BuilderRecord, "the builder record")
    runs = [(name, data.get(name)) for name in ("run", "mlp", "ragged")]
    ranks = data.get("ranks")
    if ranks is not None:
        entries(ranks, schema.BuilderRanks, "the two-process run")
        need(isinstance(ranks.get("runs"), list) and len(ranks["runs"]) <= 2,
              "the two-process run's runs are not a list of at most 2")
        text_or_none(ranks.get("error"), "the two-process run's error")
        runs += [(f"rank {r}", run) for r, run in enumerate(ranks["runs"])]
    for name, run in runs:
        if run is None:
            continue
        entries(run, schema.BuilderRun, f"the {name} run")
        need(run.get("crashed_in", "") in ("", "q", "k"),
             f"the {name} run's crashed_in is not one of '', 'q', 'k'")
        if "module" in run:
            entries(run["module"], schema.BuilderModule, f"the {name} run's module")
            names = run["module"].get("encoder_names", list(ENCODER_NAMES[0]))
            need(isinstance(names, list) and tuple(names) in ENCODER_NAMES,
                 f"the {name} run's encoder names are not a known pair")
        if run.get("initial") is not None:
            entries(run["initial"], schema.BuilderState, f"the {name} run's initial state")
        steps = run.get("steps", [])
        need(isinstance(steps, list), f"the {name} run's steps are not a list")
        for t, step in enumerate(steps):
            in_time()
            where = f"the {name} run's step {t}"
            entries(step, schema.BuilderStep, where)
            for state, record_type in (("before", schema.BuilderState),
                                       ("after_forward", schema.BuilderState),
                                       ("after_step", schema.EncoderParameters)):
                if step.get(state) is not None:
                    entries(step[state], record_type, f"{where}.{state}")
            for e, event in enumerate(step.get("events") or []):
                entries(event, schema.BuilderForward, f"{where}'s forward {e}")
            pairs = step.get("pairs")
            if pairs is not None:
                need(isinstance(pairs, list) and len(pairs) == 2,
                      f"{where}'s pairs are not a list of two")
                for i, pair in enumerate(pairs):
                    need(isinstance(pair, dict) and set(pair) == {"logits", "labels"},
                          f"{where}'s pair {i} is not {{logits, labels}}")
                    tensor_of(pair["logits"], f"{where}'s pair {i} logits", ndim=2)
                    tensor_of(pair["labels"], f"{where}'s pair {i} labels")
            if "loss_returned" in step:
                boolean(step["loss_returned"], f"{where}.loss_returned")
    if data.get("defaults") is not None:
        _defaults_run(data["defaults"])
    try:
        from moco_ref.probe.builder import default_builder_probe
    except ImportError:
        return
    probe = default_builder_probe(options)
    for name, run in runs:
        if name in ("run", "ragged", "rank 0", "rank 1") and isinstance(run, dict):
            _builder_forwards(name, run, probe)
    if "probe" in data:
        expected = default_builder_probe(options).to_dict()
        need(data["probe"] == expected,
              f"the record names probe {data['probe']}, the grader ran {expected}")

# the check that judges a module's buffers: what needs a buffer the module lacks needs it
BUILDER_INTERFACE = "contract-builder-interface"


def _run_label(name: str) -> str:
    return "main" if name == "run" else name

def _builder_loss(name: str, t: int, step: dict) -> None:
    """The loss the probe trained on is the cross-entropy of the recorded logits (summed over
    a symmetric module's two pairs; of all rows of a pair that stacks both halves, whose
    recorded logits are both pairs' rows), unless the module returned a loss of its own."""
    if step.get("loss_returned") is not False or not isinstance(step.get("loss"), float):
        return
    pairs = recorded_pairs(step)
    if _stacked(step, pairs):
        pairs = [(step.get("logits"), step.get("labels"))]
    try:
        recomputed = sum(pair_cross_entropies(pairs))
    except Exception:  # noqa: BLE001 - logits or labels the checks name as malformed
        return
    need(abs(recomputed - step["loss"]) <= 1e-4 * max(1.0, abs(recomputed)),
          f"the {_run_label(name)} run's step {t}: the recorded logits give "
          f"the loss {recomputed:.8g}, not the {step['loss']:.8g} the probe trained on: "
          "observations were altered")

def recorded_pairs(step: dict) -> list:
    """A recorded step's (logits, labels) pairs: a symmetric module's two halves, else the
    one pair ``forward`` gave."""
    return [(p.get("logits"), p.get("labels")) for p in step["pairs"]] if step.get(
        "pairs") else [(step.get("logits"), step.get("labels"))]


def pair_cross_entropies(pairs: list) -> list[float]:
    """The cross-entropy of each (logits, labels) pair, recomputed in float64 (raises on
    malformed logits or labels)."""
    with torch.no_grad():
        return [float(torch.nn.functional.cross_entropy(
            logits.to(torch.float64), labels.to(torch.int64))) for logits, labels in pairs]

def _stacked(step: dict, pairs: list) -> bool:
    """Whether the returned logits are the two pairs' rows stacked (``[2B, 1 + K]``)."""
    logits = step.get("logits")
    return len(pairs) == 2 and isinstance(logits, torch.Tensor) and logits.ndim == 2 and all(
        isinstance(p, torch.Tensor) and p.ndim == 2 for p, _ in pairs) and len(logits) == sum(
        len(p) for p, _ in pairs) and all(len(p) for p, _ in pairs)

def _builder_forwards(name: str, run: dict, probe) -> None:
    """Every recorded forward of the intact probe encoder in training mode is what that
    encoder computes from the parameters recorded with it on the images its rows name."""
    from moco_ref.probe.builder import (
        ProbeEncoder,
        probe_images,
        ragged_probe,
        ranks_probe,
        world_images,
    )

    if name == "ragged":
        probe = ragged_probe(probe)
    elif name.startswith("rank"):
        probe = ranks_probe(probe)
    net = ProbeEncoder(probe.dim).train()
    target = torch.nn.utils.parameters_to_vector(net.parameters())
    for t, step in enumerate(run.get("steps") or []):
        in_time()
        _builder_loss(name, t, step)
        images = world_images(probe, t) if name.startswith("rank") else probe_images(probe, t)
        for e, event in enumerate(step.get("events") or []):
            if not (event.get("probe_encoder") is True and event.get("training") is True
                    and event.get("role") in ("q", "k")):
                continue
            params = event.get(f"params_{event['role']}")
            views, rows, output = event.get("views"), event.get("rows"), event.get("output")
            if not all(isinstance(v, torch.Tensor) for v in (params, views, rows, output)) or \
                    params.numel() != target.numel() or output.ndim != 2 or \
                    len(rows) != len(output) or len(views) != len(rows) or len(rows) < 2:
                continue
            if not bool(((views == 0) | (views == 1)).all()) or not bool(
                    ((rows >= 0) & (rows < len(images[0]))).all()):
                continue  # rows the probe cannot trace: nothing to recompute with
            x = torch.stack([images[int(v)][int(r)] for v, r in zip(views, rows)])
            torch.nn.utils.vector_to_parameters(params.to(target.dtype), net.parameters())
            with torch.no_grad():
                recomputed = net(x)
            scale = max(1.0, float(recomputed.abs().max()))
            worst = float((recomputed - output.to(recomputed.dtype)).abs().max()) / scale
            need(worst <= BUILDER_FORWARD_TOLERANCE,
                  f"the {_run_label(name)} run's step {t}, forward {e}: the "
                  "recorded output of "
                  f"encoder_{event['role']} differs by {worst:.3g} (relative) from what the "
                  "probe encoder computes with the recorded parameters on the recorded images: "
                  "observations were altered")


def recorded_pointer(value) -> int | None:
    """A recorded ``queue_ptr`` as an int (None: no one-element integer tensor)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        return int(value.reshape(-1)[0])
    return None


MAX_DEFAULTS_STEPS = 8
MAX_DEFAULT_SIZE = 2**20  # a default K or dim beyond this is no queue a course trains


def _defaults_run(run) -> None:
    """The run at the constructor's defaults: its few steps, each a handful of small tensors
    whose sizes follow the queue it names."""
    entries(run, schema.DefaultsRun, "the run at the constructor's defaults")
    text_or_none(run.get("error"), "the defaults run's error")
    defaults = run.get("defaults", {})
    need(isinstance(defaults, dict) and set(defaults) <= {"dim", "K", "m", "T"} and all(
        isinstance(v, float) for v in defaults.values()), "the defaults run's defaults")
    steps = run.get("steps", [])
    need(isinstance(steps, list) and len(steps) <= MAX_DEFAULTS_STEPS,
         "the defaults run's steps are not a short list")
    if not steps:
        return
    K = integer(run.get("K"), "the defaults run's K", 1)
    dim = integer(run.get("dim"), "the defaults run's dim", 1)
    batch = integer(run.get("batch"), "the defaults run's batch", 1)
    need(K <= MAX_DEFAULT_SIZE and dim <= 4096, "the defaults run's queue is too large")
    for t, step in enumerate(steps):
        in_time()
        where = f"the defaults run's step {t}"
        entries(step, schema.DefaultsStep, where)
        sizes = set()
        for name in ("params_q", "params_k"):
            if step.get(name) is not None:
                sizes.add(tensor_of(step[name], f"{where}.{name}", ndim=1).numel())
        need(len(sizes) <= 1, f"{where}'s parameter vectors differ in length")
        keys = step.get("keys")
        if keys is not None:
            keys = tensor_of(keys, f"{where}.keys", ndim=2)
            need(keys.shape[1] == dim and keys.shape[0] <= 4 * batch, f"{where}.keys' shape")
        ptr = step.get("ptr_before")
        need(ptr is None or isinstance(ptr, int), f"{where}.ptr_before")
        need(integer(step.get("changed_count"), f"{where}.changed_count", 0) <= K,
             f"{where}.changed_count exceeds K")
