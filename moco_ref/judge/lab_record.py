"""Validation of a ``lab`` record against the probe the grader ran (see ``record`` for what
validation is for).

The probe, the training ids, the initial parameters and the parameter layout are rebuilt here
(``probe.lab.LabProbeWorld``), not read back; every recorded output of the probe model is
recomputed from the recorded parameter snapshot and input (the probe's own views, rebuilt here
from the seed and the ids). This binds outputs to parameters, parameters to the EMA law the
judge fits, and gradients to the loss the judge recomputes: a record that passes is the record
of a run that really computed MoCo.
"""

from __future__ import annotations

import torch

from moco_ref.judge.record import (
    Invalid,
    boolean,
    entries,
    in_time,
    integer,
    need,
    tensor_of,
    text_or_none,
    validate_warmup,
)
from moco_ref.probe import schema
from moco_ref.probe.cases import LabProbe, default_lab_probe, short_lab_probe
from moco_ref.probe.lab import (
    MAX_EVENTS,
    PROJECTION_DIM,
    LabProbeWorld,
    ProbeNet,
    parameter_layout,
)
from moco_ref.probe.options import GradeOptions
from moco_ref.probe.parts import INPUT_MUTATED, PROBE_DTYPE

MAX_VIEW_CALLS = 10_000

FORWARD_ATOL = 2e-2  # recomputed vs recorded outputs: |Δ| ≤ atol + rtol·|output|

FORWARD_RTOL = 2e-2

INITIAL_ATOL = 1e-5  # a submission may change torch's default dtype: not bit for bit

_PROBE_DTYPES = {str(dtype): dtype for dtype in (torch.float32, torch.float64)}



def validate_lab_part(name: str, data, meta: dict, options: GradeOptions) -> None:
    _lab_meta(meta, options)
    if name == "moco_warmup":
        validate_warmup(data)
    elif name == "train_moco":
        dtype = _PROBE_DTYPES.get(meta.get(PROBE_DTYPE, "torch.float32"))
        need(dtype is not None, f"the probe cannot have been built in {meta[PROBE_DTYPE]}")
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # the probe is rebuilt as the submission's was
        try:
            _training(data, options)
        finally:
            torch.set_default_dtype(previous)
    else:
        raise Invalid(f"a lab record has no part {name!r}")

def _expected_lab_probe(options: GradeOptions):
    return default_lab_probe(options.seed, options.probe_key)

def _lab_meta(meta: dict, options: GradeOptions) -> None:
    entries(meta, schema.LabRecord, "the record's shared entries")
    expected = _expected_lab_probe(options).to_dict()
    need(meta.get("probe") == expected,
          f"the record names probe {meta.get('probe')}, the grader ran {expected}")

def _training(data, options: GradeOptions, probe: LabProbe | None = None) -> None:
    """``data``, the record of a run on ``probe`` (the main probe unless given); a main
    record's ``short_run`` is the record of the run on ``short_lab_probe``."""
    entries(data, schema.TrainingRecord, "train_moco's record")
    defined = boolean(data.get("defined"), "train_moco.defined")
    text_or_none(data.get("error"), "train_moco.error")
    if not defined:
        return
    main = probe is None
    probe = _expected_lab_probe(options) if main else probe
    if "short_run" in data:
        need(main and not data.get("error"), "a short run is recorded only beside a main run "
             "that finished")
        _training(data["short_run"], options, short_lab_probe(probe))
    world = LabProbeWorld(probe)
    P = int(world.initial_params.numel())
    need(data.get("layout") == parameter_layout(world.initial),
          "the parameter layout is not the probe model's")
    initial = tensor_of(data.get("initial_params"), "initial_params", dtype=torch.float32,
                      shape=(P,))
    need(bool((initial - world.initial_params).abs().max() <= INITIAL_ATOL),
          "initial_params are not the probe model's initial parameters")
    train = tensor_of(data.get("train"), "train", dtype=torch.int64, ndim=1)
    need(torch.equal(train, world.train), "train is not the probe's training ids")
    need(data.get("projection_dim") == PROJECTION_DIM, "projection_dim is not the probe's")
    for key in ("events", "view_calls", "instances", "dropped_events"):
        need(key in data, f"train_moco's record lacks {key!r}")
    n_images = probe.n_images
    view_calls = data["view_calls"]
    need(isinstance(view_calls, list) and len(view_calls) <= min(MAX_VIEW_CALLS,
                                                                  probe.max_view_calls),
         f"view_calls is not a list of at most {probe.max_view_calls} calls (the most a run "
         "of the probe makes)")
    rows = 0
    for c, ids in enumerate(view_calls):
        in_time()
        tensor_of(ids, f"view call {c}", dtype=torch.int64, ndim=1)
        rows += int(ids.numel())
        need(rows <= probe.max_view_rows, f"the view calls hold more than "
             f"{probe.max_view_rows} images together (the most a run of the probe gives)")
        need(bool(((ids >= -1) & (ids < n_images)).all()), f"view call {c} has ids out of range")
    instances = integer(data["instances"], "instances", 1)
    integer(data["dropped_events"], "dropped_events", 0)
    events = data["events"]
    need(isinstance(events, list) and len(events) <= MAX_EVENTS,
          "events is not a list of bounded length")
    clock, calls = 0, 0
    for index, event in enumerate(events):
        in_time()
        where = f"event {index}"
        entries(event, schema.ForwardEvent, where)
        tag = integer(event.get("instance"), f"{where}.instance", 0)
        need(tag < instances, f"{where} names model copy {tag} of {instances}")
        now = integer(event.get("clock"), f"{where}.clock", 1)
        need(now > clock, f"{where}'s clock does not move forward")
        clock = now
        seen = integer(event.get("view_calls"), f"{where}.view_calls", 0)
        need(calls <= seen <= len(view_calls), f"{where} counts view calls out of order")
        calls = seen
        output = tensor_of(event.get("output"), f"{where}.output", dtype=torch.float32,
                         shape=(None, PROJECTION_DIM))
        rows = len(output)
        rows_call = tensor_of(event.get("rows_call"), f"{where}.rows_call", dtype=torch.int64,
                            shape=(rows,))
        rows_id = tensor_of(event.get("rows_id"), f"{where}.rows_id", dtype=torch.int64,
                          shape=(rows,))
        need(bool(((rows_call >= -2) & (rows_call < seen)).all()),
              f"{where} has inputs from view calls that had not happened")
        need(bool(((rows_id >= -1) & (rows_id < n_images)).all()), f"{where} has ids out of range")
        _sources_agree(where, rows_call, rows_id, view_calls)
        for flag in ("grad_enabled", "output_requires_grad", "output_has_grad_fn"):
            boolean(event.get(flag), f"{where}.{flag}")
        tags = event.get("snapshot_tags")
        need(isinstance(tags, list) and all(isinstance(t, int) and 0 <= t < instances
                                             for t in tags), f"{where}.snapshot_tags is malformed")
        params = event.get("params")
        need(isinstance(params, list) and len(params) == len(tags),
              f"{where} has {len(params) if isinstance(params, list) else '?'} snapshots for "
              f"{len(tags)} copies")
        for p in params:
            tensor_of(p, f"{where}.params", dtype=torch.float32, shape=(P,))
        has_grad = event.get("has_grad")
        need(isinstance(has_grad, list) and len(has_grad) == len(tags)
              and all(isinstance(v, bool) for v in has_grad), f"{where}.has_grad is malformed")
        grad = event.get("grad")
        if grad is not None:
            tensor_of(grad, f"{where}.grad", dtype=torch.float32, shape=(rows, PROJECTION_DIM))
        grad_clock = integer(event.get("grad_clock"), f"{where}.grad_clock")
        need(grad_clock == -1 or grad_clock > now, f"{where}'s gradient came before it")
        integer(event.get("grad_calls"), f"{where}.grad_calls", 0)
        if event.get("own_grad") is not None:
            tensor_of(event["own_grad"], f"{where}.own_grad", dtype=torch.float32, shape=(P,))
        need((grad is None) == (event["grad_calls"] == 0),
              f"{where}'s gradient and gradient count disagree")
    if "returned" in data:
        _returned(data["returned"], P)
    if not data.get(INPUT_MUTATED):  # else the inputs cannot be rebuilt from the probe
        _forwards(events, view_calls, world)

def _sources_agree(where: str, rows_call: torch.Tensor, rows_id: torch.Tensor,
                   view_calls: list) -> None:
    """A row traced to view call c has one of that call's ids; a raw image has an id; an
    untraced row has none (the probe's ``_sources_of_inputs``)."""
    raw = rows_call == -1
    need(bool((rows_id[raw] >= 0).all()), f"{where}: a raw image row without an id")
    untraced = rows_call == -2
    need(bool((rows_id[untraced] == -1).all()), f"{where}: an untraced row with an id")
    for call in rows_call[rows_call >= 0].unique().tolist():
        ids = rows_id[rows_call == call]
        need(bool(torch.isin(ids, view_calls[call]).all()),
              f"{where}: rows traced to view call {call} carry ids that call never had")

def _returned(returned, P: int) -> None:
    entries(returned, schema.Returned, "train_moco's returned value")
    need(isinstance(returned.get("type"), str), "returned.type is not text")
    length = returned.get("length")
    need(length is None or (isinstance(length, int) and 0 <= length <= 10_000),
          "returned.length is malformed")
    need(isinstance(returned.get("items"), list), "returned.items is not a list")
    for role in ("query", "key"):
        if f"{role}_params" in returned:
            tensor_of(returned[f"{role}_params"], f"returned {role}_params", dtype=torch.float32,
                    ndim=1)
        if f"{role}_instance" in returned:
            integer(returned[f"{role}_instance"], f"returned {role}_instance", -1)
    drift = returned.get("drift")
    need(drift is None or isinstance(drift, (int, float, dict, list, str, torch.Tensor)),
          "returned.drift is malformed")

def _forwards(events: list, view_calls: list, world) -> None:
    """Every output is what the probe model computes from its snapshot and its input."""
    inputs = view_inputs(view_calls, world)
    net = ProbeNet()
    vector = torch.nn.utils.parameters_to_vector
    target = vector(net.parameters())
    for index, event in enumerate(events):
        in_time()
        tag = event["instance"]
        if tag not in event["snapshot_tags"]:
            continue  # more copies than the probe snapshots: nothing to recompute with
        params = event["params"][event["snapshot_tags"].index(tag)]
        rows, x = event_inputs(event, inputs, world)
        if not rows:
            continue
        torch.nn.utils.vector_to_parameters(params.to(target.dtype), net.parameters())
        with torch.no_grad():
            _, projection = net(x)
        recorded = event["output"][rows]
        error = (projection - recorded).abs() - (FORWARD_ATOL + FORWARD_RTOL * recorded.abs())
        if bool((error > 0).any()):
            worst = float((projection - recorded).abs().max())
            raise Invalid(
                f"event {index}: the recorded output of the probe model differs by {worst:.3g} "
                "from what the model computes with the recorded parameters on the recorded "
                "input: observations were altered")

def event_inputs(event, inputs: dict, world) -> tuple[list[int], torch.Tensor | None]:
    """``(rows, x [len(rows), 1, 8, 8])``: the rows of a recorded forward whose input the
    grader can rebuild (a raw probe image, or a view from ``view_inputs``), and those
    inputs; ``x`` is None when there are none."""
    images = world.images.reshape(len(world.images), -1)
    rows, xs = [], []
    for row, (call, source) in enumerate(zip(event["rows_call"].tolist(),
                                             event["rows_id"].tolist())):
        if call == -1 and source >= 0:
            rows.append(row)
            xs.append(images[source])
        elif call >= 0 and source >= 0 and (call, source) in inputs:
            rows.append(row)
            xs.append(inputs[(call, source)])
    if not rows:
        return rows, None
    return rows, torch.stack(xs).reshape(len(xs), *world.images.shape[1:])

def view_inputs(view_calls: list, world) -> dict[tuple[int, int], torch.Tensor]:
    """``(call, id) → [64]`` the view the probe's ``views`` gave for that id in that call,
    rebuilt by the probe's own ``view`` of the same images at the same call. When an
    id appears twice in a call its noise differs: such rows are left out."""
    out: dict[tuple[int, int], torch.Tensor] = {}
    for call, ids in enumerate(view_calls):
        in_time()
        id_list = ids.tolist()
        safe = torch.tensor([max(i, 0) for i in id_list], dtype=torch.int64)
        views = world.view(call, world.images[safe].clone())
        views = views.reshape(len(id_list), -1)
        counts: dict[int, int] = {}
        for i in id_list:
            counts[i] = counts.get(i, 0) + 1
        for row, source in enumerate(id_list):
            if source >= 0 and counts[source] == 1:
                out[(call, source)] = views[row]
    return out


def short_run_observations(observations: dict) -> dict | None:
    """The record of the second, short run (``cases.short_lab_probe``) as a lab record of its
    own — the main record's shared entries, the short probe and the short run as
    ``train_moco`` — or None when there is none (the main run did not finish, or an older
    record)."""
    training = observations.get("train_moco")
    short = training.get("short_run") if isinstance(training, dict) else None
    if not isinstance(short, dict):
        return None
    probe = short_lab_probe(LabProbe.from_dict(observations.get("probe", {})))
    return {**observations, "probe": probe.to_dict(), "train_moco": short}
