"""Strict validation of an observation record, in the grader's process, before judging.

The record comes from the submission's process, which the submission controls: it can patch
the observer, empty its lists, or write a record of its own. The judge already recomputes
every verdict from raw observations; this module makes sure those observations are what the
grader's own probe produces before any of them is believed:

- **structure**: every dict holds only the keys its ``observe.record_schema`` type names,
  every entry has the type, dtype and shape the observer writes; counts are
  bounded and consistent (one id and one output row per input row, parameter snapshots of
  the probe model's size, clocks increasing, view calls in order);
- **the probe**: the probe, the seed, the training ids, the initial parameters and the
  parameter layout are the ones the grader asked for — recomputed here, not read back;
- **the forwards** (``lab``): every recorded output of the probe model is recomputed from the
  recorded parameter snapshot and the recorded input (the probe's own views, rebuilt here from
  the seed and the ids): an output that no real forward of the probe model gives is a forgery
  or a corruption. This binds outputs to parameters, parameters to the EMA law the judge
  fits, and gradients to the loss the judge recomputes: a record that passes is the record of
  a run that really computed MoCo.

``validate_part`` returns "" or the first problem found; the grade then discards that part,
and every check that needs it reports an error — never a pass.
"""

from __future__ import annotations

import torch

from moco_ref.observe import record_schema as schema
from moco_ref.observe.options import GradeOptions
from moco_ref.observe.parts import INPUT_MUTATED, PROBE_DTYPE
from moco_ref.observe.styles import COMPONENTS

MAX_PART_TENSOR_BYTES = 512 * 2**20  # far above what any probe records
MAX_EVENTS = 2000  # probe.MAX_EVENTS: the observer records no more
MAX_VIEW_CALLS = 10_000
FORWARD_ATOL = 2e-2  # recomputed vs recorded outputs: |Δ| ≤ atol + rtol·|output|
FORWARD_RTOL = 2e-2
INITIAL_ATOL = 1e-5  # a submission may change torch's default dtype: not bit for bit


_PROBE_DTYPES = {str(dtype): dtype for dtype in (torch.float32, torch.float64)}


class Invalid(ValueError):
    pass


def validate_part(style: str, name: str, data, meta, options: GradeOptions) -> str:
    """"" if the part's observations are well-formed and consistent with the probe the grader
    ran; otherwise what is wrong with them."""
    try:
        with torch.random.fork_rng(devices=[]):  # the grader's own random state is untouched
            _validate(style, name, data, meta, options)
    except Invalid as problem:
        return str(problem)
    except Exception as exc:  # noqa: BLE001 - malformed beyond what the checks foresee
        return f"the record could not be read ({type(exc).__name__}: {exc})"
    return ""


def _validate(style: str, name: str, data, meta, options: GradeOptions) -> None:
    from moco_ref.judge.styles import JUDGED_STYLES

    _need(isinstance(meta, dict), "the record's shared entries are not a dict")
    known = JUDGED_STYLES.get(style)
    _need(known is not None, f"no style {style!r} is judged")
    _plain(data, "the part", tensor_bytes=[0], types=False)
    _plain(meta, "the record's shared entries", tensor_bytes=[0], types=False)
    known.validate(name, data, meta, options)
    _plain(data, "the part")


def validate_lab_part(name: str, data, meta: dict, options: GradeOptions) -> None:
    _lab_meta(meta, options)
    if name == "moco_warmup":
        _warmup(data)
    elif name == "train_moco":
        dtype = _PROBE_DTYPES.get(meta.get(PROBE_DTYPE, "torch.float32"))
        _need(dtype is not None, f"the probe cannot have been built in {meta[PROBE_DTYPE]}")
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # the probe is rebuilt as the submission's was
        try:
            _training(data, options)
        finally:
            torch.set_default_dtype(previous)
    else:
        raise Invalid(f"a lab record has no part {name!r}")


def validate_components_part(name: str, data, meta: dict, options: GradeOptions) -> None:
    _components_meta(meta, options)
    if name == "moco_warmup":
        _warmup(data)
    else:
        _component_outputs(name, data, options)


def validate_builder_part(name: str, data, meta: dict, options: GradeOptions) -> None:
    _builder(data, options)


# --------------------------------------------------------------------------- helpers


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise Invalid(message)


def _tensor(value, where: str, *, dtype=None, ndim: int | None = None,
            shape: tuple | None = None) -> torch.Tensor:
    _need(type(value) is torch.Tensor, f"{where} is not a tensor")
    if dtype is not None:
        _need(value.dtype == dtype, f"{where} is {value.dtype}, not {dtype}")
    if ndim is not None:
        _need(value.ndim == ndim, f"{where} has {value.ndim} dimensions, not {ndim}")
    if shape is not None:
        _need(len(value.shape) == len(shape) and all(
            want is None or got == want for got, want in zip(value.shape, shape)),
            f"{where} has shape {list(value.shape)}, not {list(shape)}")
    return value


def _int(value, where: str, low: int | None = None) -> int:
    _need(isinstance(value, int) and not isinstance(value, bool), f"{where} is not an integer")
    if low is not None:
        _need(value >= low, f"{where} is {value} < {low}")
    return value


def _bool(value, where: str) -> bool:
    _need(isinstance(value, bool), f"{where} is not a bool")
    return value


def _entries(value, record_type: type, where: str) -> dict:
    """``value`` is a dict whose keys are all named by ``record_type`` (record_schema)."""
    _need(isinstance(value, dict), f"{where} is not a dict")
    extra = set(value) - schema.keys_of(record_type)
    _need(not extra, f"{where} has entries the observer never writes: "
                     f"{sorted(map(str, extra))[:5]}")
    return value


def _text_or_none(value, where: str) -> None:
    _need(value is None or isinstance(value, str), f"{where} is neither text nor None")


def _plain(value, where: str, *, tensor_bytes: list[int] | None = None, types: bool = True,
           depth: int = 0) -> None:
    """One walk of a part, not nested absurdly deep. With ``types``: only plain data. With
    ``tensor_bytes`` (a running total): every tensor an ordinary strided one whose elements
    all lie in bytes that were sent (no stride-0 expansion, no overlapping view that
    multiplies its storage), all of them together within ``MAX_PART_TENSOR_BYTES`` — the
    walk done before any work is done on a part."""
    _need(depth <= 24, f"{where} is nested too deep")
    if type(value) is torch.Tensor:
        if tensor_bytes is not None:
            _dense(value, where, tensor_bytes)
    elif isinstance(value, dict):
        for key, item in value.items():
            _need(not types or isinstance(key, (str, int)),
                  f"{where} has a key of type {type(key).__name__}")
            _plain(item, where, tensor_bytes=tensor_bytes, types=types, depth=depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _plain(item, where, tensor_bytes=tensor_bytes, types=types, depth=depth + 1)
    elif types and not (value is None or isinstance(value, (bool, int, float, str))):
        raise Invalid(f"{where} holds a {type(value).__name__}")


def _dense(tensor: torch.Tensor, where: str, tensor_bytes: list[int]) -> None:
    _need(tensor.layout == torch.strided and not tensor.is_quantized,
          f"{where} holds a {tensor.layout} tensor")
    logical = tensor.numel() * tensor.element_size()
    stored = tensor.untyped_storage().nbytes()
    _need(logical <= stored and (tensor.numel() <= 1 or tensor.is_contiguous() or all(
        stride > 0 or size == 1 for size, stride in zip(tensor.shape, tensor.stride()))),
        f"{where} holds a tensor of shape {list(tensor.shape)} that is not dense "
        f"({logical} bytes of elements over {stored} bytes sent)")
    tensor_bytes[0] += logical
    _need(tensor_bytes[0] <= MAX_PART_TENSOR_BYTES,
          f"{where} holds more than {MAX_PART_TENSOR_BYTES} bytes of tensors")


# --------------------------------------------------------------------------- warm-up


def _warmup(data) -> None:
    _entries(data, schema.WarmupRecord, "moco_warmup's record")
    _bool(data.get("defined"), "moco_warmup.defined")
    _text_or_none(data.get("error"), "moco_warmup.error")


# --------------------------------------------------------------------------- lab


def _expected_lab_probe(options: GradeOptions):
    from moco_ref.observe.strategies import default_lab_probe

    return default_lab_probe(options.seed)


def _lab_meta(meta: dict, options: GradeOptions) -> None:
    _entries(meta, schema.LabRecord, "the record's shared entries")
    expected = _expected_lab_probe(options).to_dict()
    _need(meta.get("probe") == expected,
          f"the record names probe {meta.get('probe')}, the grader ran {expected}")


def _training(data, options: GradeOptions) -> None:
    from moco_ref.observe.lab_probe import PROJECTION_DIM, ProbeRecorder, parameter_layout

    _entries(data, schema.TrainingRecord, "train_moco's record")
    defined = _bool(data.get("defined"), "train_moco.defined")
    _text_or_none(data.get("error"), "train_moco.error")
    if not defined:
        return
    probe = _expected_lab_probe(options)
    recorder = ProbeRecorder(probe)
    P = int(recorder.initial_params.numel())
    _need(data.get("layout") == parameter_layout(recorder.initial),
          "the parameter layout is not the probe model's")
    initial = _tensor(data.get("initial_params"), "initial_params", dtype=torch.float32,
                      shape=(P,))
    _need(bool((initial - recorder.initial_params).abs().max() <= INITIAL_ATOL),
          "initial_params are not the probe model's initial parameters")
    train = _tensor(data.get("train"), "train", dtype=torch.int64, ndim=1)
    _need(torch.equal(train, recorder.train), "train is not the probe's training ids")
    _need(data.get("projection_dim") == PROJECTION_DIM, "projection_dim is not the probe's")
    for key in ("events", "view_calls", "instances", "dropped_events"):
        _need(key in data, f"train_moco's record lacks {key!r}")
    n_images = probe.n_images
    view_calls = data["view_calls"]
    _need(isinstance(view_calls, list) and len(view_calls) <= MAX_VIEW_CALLS,
          "view_calls is not a list of bounded length")
    for c, ids in enumerate(view_calls):
        _tensor(ids, f"view call {c}", dtype=torch.int64, ndim=1)
        _need(bool(((ids >= -1) & (ids < n_images)).all()), f"view call {c} has ids out of range")
    instances = _int(data["instances"], "instances", 1)
    _int(data["dropped_events"], "dropped_events", 0)
    events = data["events"]
    _need(isinstance(events, list) and len(events) <= MAX_EVENTS,
          "events is not a list of bounded length")
    clock, calls = 0, 0
    for index, event in enumerate(events):
        where = f"event {index}"
        _entries(event, schema.ForwardEvent, where)
        tag = _int(event.get("instance"), f"{where}.instance", 0)
        _need(tag < instances, f"{where} names model copy {tag} of {instances}")
        now = _int(event.get("clock"), f"{where}.clock", 1)
        _need(now > clock, f"{where}'s clock does not move forward")
        clock = now
        seen = _int(event.get("view_calls"), f"{where}.view_calls", 0)
        _need(calls <= seen <= len(view_calls), f"{where} counts view calls out of order")
        calls = seen
        output = _tensor(event.get("output"), f"{where}.output", dtype=torch.float32,
                         shape=(None, PROJECTION_DIM))
        rows = len(output)
        rows_call = _tensor(event.get("rows_call"), f"{where}.rows_call", dtype=torch.int64,
                            shape=(rows,))
        rows_id = _tensor(event.get("rows_id"), f"{where}.rows_id", dtype=torch.int64,
                          shape=(rows,))
        _need(bool(((rows_call >= -2) & (rows_call < seen)).all()),
              f"{where} has inputs from view calls that had not happened")
        _need(bool(((rows_id >= -1) & (rows_id < n_images)).all()), f"{where} has ids out of range")
        _sources_agree(where, rows_call, rows_id, view_calls)
        for flag in ("grad_enabled", "output_requires_grad", "output_has_grad_fn"):
            _bool(event.get(flag), f"{where}.{flag}")
        tags = event.get("snapshot_tags")
        _need(isinstance(tags, list) and all(isinstance(t, int) and 0 <= t < instances
                                             for t in tags), f"{where}.snapshot_tags is malformed")
        params = event.get("params")
        _need(isinstance(params, list) and len(params) == len(tags),
              f"{where} has {len(params) if isinstance(params, list) else '?'} snapshots for "
              f"{len(tags)} copies")
        for p in params:
            _tensor(p, f"{where}.params", dtype=torch.float32, shape=(P,))
        has_grad = event.get("has_grad")
        _need(isinstance(has_grad, list) and len(has_grad) == len(tags)
              and all(isinstance(v, bool) for v in has_grad), f"{where}.has_grad is malformed")
        grad = event.get("grad")
        if grad is not None:
            _tensor(grad, f"{where}.grad", dtype=torch.float32, shape=(rows, PROJECTION_DIM))
        grad_clock = _int(event.get("grad_clock"), f"{where}.grad_clock")
        _need(grad_clock == -1 or grad_clock > now, f"{where}'s gradient came before it")
        _int(event.get("grad_calls"), f"{where}.grad_calls", 0)
        if event.get("own_grad") is not None:
            _tensor(event["own_grad"], f"{where}.own_grad", dtype=torch.float32, shape=(P,))
        _need((grad is None) == (event["grad_calls"] == 0),
              f"{where}'s gradient and gradient count disagree")
    if "returned" in data:
        _returned(data["returned"], P)
    if not data.get(INPUT_MUTATED):  # else the inputs cannot be rebuilt from the probe
        _forwards(events, view_calls, recorder)


def _sources_agree(where: str, rows_call: torch.Tensor, rows_id: torch.Tensor,
                   view_calls: list) -> None:
    """A row traced to view call c has one of that call's ids; a raw image has an id; an
    untraced row has none (the probe's ``_sources_of_inputs``)."""
    raw = rows_call == -1
    _need(bool((rows_id[raw] >= 0).all()), f"{where}: a raw image row without an id")
    untraced = rows_call == -2
    _need(bool((rows_id[untraced] == -1).all()), f"{where}: an untraced row with an id")
    for call in rows_call[rows_call >= 0].unique().tolist():
        ids = rows_id[rows_call == call]
        _need(bool(torch.isin(ids, view_calls[call]).all()),
              f"{where}: rows traced to view call {call} carry ids that call never had")


def _returned(returned, P: int) -> None:
    _entries(returned, schema.Returned, "train_moco's returned value")
    _need(isinstance(returned.get("type"), str), "returned.type is not text")
    length = returned.get("length")
    _need(length is None or (isinstance(length, int) and 0 <= length <= 10_000),
          "returned.length is malformed")
    _need(isinstance(returned.get("items"), list), "returned.items is not a list")
    for role in ("query", "key"):
        if f"{role}_params" in returned:
            _tensor(returned[f"{role}_params"], f"returned {role}_params", dtype=torch.float32,
                    ndim=1)
        if f"{role}_instance" in returned:
            _int(returned[f"{role}_instance"], f"returned {role}_instance", -1)
    drift = returned.get("drift")
    _need(drift is None or isinstance(drift, (int, float, dict, list, str, torch.Tensor)),
          "returned.drift is malformed")


def _forwards(events: list, view_calls: list, recorder) -> None:
    """Every output is what the probe model computes from its snapshot and its input."""
    from moco_ref.observe.lab_probe import ProbeNet

    inputs = view_inputs(view_calls, recorder)
    net = ProbeNet()
    vector = torch.nn.utils.parameters_to_vector
    target = vector(net.parameters())
    for index, event in enumerate(events):
        tag = event["instance"]
        if tag not in event["snapshot_tags"]:
            continue  # more copies than the probe snapshots: nothing to recompute with
        params = event["params"][event["snapshot_tags"].index(tag)]
        rows, x = event_inputs(event, inputs, recorder)
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


BUILDER_FORWARD_TOLERANCE = 1e-4  # relative to max(1, the largest output)


def _run_label(name: str) -> str:
    return "main" if name == "run" else name


def _builder_loss(name: str, t: int, step: dict) -> None:
    """The loss the probe trained on is the cross-entropy of the recorded logits (summed over
    a symmetric module's two pairs), unless the module returned a loss of its own."""
    if step.get("loss_returned") is not False or not isinstance(step.get("loss"), float):
        return
    pairs = [(p.get("logits"), p.get("labels")) for p in step["pairs"]] if step.get(
        "pairs") else [(step.get("logits"), step.get("labels"))]
    try:
        with torch.no_grad():
            recomputed = sum(float(torch.nn.functional.cross_entropy(
                logits.to(torch.float64), labels.to(torch.int64))) for logits, labels in pairs)
    except Exception:  # noqa: BLE001 - logits or labels the checks name as malformed
        return
    _need(abs(recomputed - step["loss"]) <= 1e-4 * max(1.0, abs(recomputed)),
          f"the {_run_label(name)} run's step {t}: the recorded logits give "
          f"the loss {recomputed:.8g}, not the {step['loss']:.8g} the probe trained on: "
          "observations were altered")


def _builder_forwards(name: str, run: dict, probe) -> None:
    """Every recorded forward of the intact probe encoder in training mode is what that
    encoder computes from the parameters recorded with it on the images its rows name."""
    from moco_ref.observe.builder_probe import ProbeEncoder, probe_images, ragged_probe
    from moco_ref.observe.builder_ranks import ranks_probe, world_images

    if name == "ragged":
        probe = ragged_probe(probe)
    elif name.startswith("rank"):
        probe = ranks_probe(probe)
    net = ProbeEncoder(probe.dim).train()
    target = torch.nn.utils.parameters_to_vector(net.parameters())
    for t, step in enumerate(run.get("steps") or []):
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
            _need(worst <= BUILDER_FORWARD_TOLERANCE,
                  f"the {_run_label(name)} run's step {t}, forward {e}: the "
                  "recorded output of "
                  f"encoder_{event['role']} differs by {worst:.3g} (relative) from what the "
                  "probe encoder computes with the recorded parameters on the recorded images: "
                  "observations were altered")


def event_inputs(event, inputs: dict, recorder) -> tuple[list[int], torch.Tensor | None]:
    """``(rows, x [len(rows), 1, 8, 8])``: the rows of a recorded forward whose input the
    grader can rebuild (a raw probe image, or a view from ``view_inputs``), and those
    inputs; ``x`` is None when there are none."""
    images = recorder.images.reshape(len(recorder.images), -1)
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
    return rows, torch.stack(xs).reshape(len(xs), *recorder.images.shape[1:])


def view_inputs(view_calls: list, recorder) -> dict[tuple[int, int], torch.Tensor]:
    """``(call, id) → [64]`` the view the probe's ``views`` gave for that id in that call,
    rebuilt by calling the probe's own ``views`` on the same images in the same order. When an
    id appears twice in a call its noise differs: such rows are left out."""
    out: dict[tuple[int, int], torch.Tensor] = {}
    for call, ids in enumerate(view_calls):
        id_list = ids.tolist()
        safe = torch.tensor([max(i, 0) for i in id_list], dtype=torch.int64)
        views = recorder.views(recorder.images[safe].clone())
        views = views.reshape(len(id_list), -1)
        counts: dict[int, int] = {}
        for i in id_list:
            counts[i] = counts.get(i, 0) + 1
        for row, source in enumerate(id_list):
            if source >= 0 and counts[source] == 1:
                out[(call, source)] = views[row]
    return out


# --------------------------------------------------------------------------- components


def _components_meta(meta: dict, options: GradeOptions) -> None:
    _entries(meta, schema.ComponentsRecord, "the record's shared entries")
    names = {entry for part in COMPONENTS.parts for entry in part.entry_points}
    _need(meta.get("seed") == int(options.seed), "the record's seed is not the grader's")
    defined = meta.get("defined", {})
    _need(isinstance(defined, dict) and set(defined) <= names
          and all(isinstance(v, bool) for v in defined.values()),
          "the record's 'defined' entry is malformed")
    fingerprints = meta.get("fingerprints", {})
    _need(isinstance(fingerprints, dict) and all(isinstance(v, str)
                                                 for v in fingerprints.values()),
          "the record's fingerprints are malformed")


def _component_outputs(kind: str, data, options: GradeOptions) -> None:
    from moco_ref.observe.strategies import component_cases

    if data is None:
        return  # not defined
    cases = component_cases(kind, options.seed)
    _need(isinstance(data, list) and len(data) == len(cases),
          f"{kind}: {len(data) if isinstance(data, list) else '?'} outputs for "
          f"{len(cases)} cases")
    for number, output in enumerate(data):
        where = f"{kind} case {number}"
        _need(isinstance(output, dict), f"{where} is not a dict")
        if "error" in output:
            _entries(output, schema.CaseError, where)
            _need(isinstance(output["error"], str), f"{where}'s error is malformed")
            continue
        _entries(output, schema.CASE_OUTPUTS[kind], where)
        if kind == "queue":
            batches = len(cases[number].batch_sizes)
            for key in ("keys", "ids", "len"):
                _need(isinstance(output.get(key), list) and len(output[key]) == batches,
                      f"{where}.{key} does not hold one entry per enqueue")
            for tensor in output["keys"] + output["ids"]:
                _tensor(tensor, where)
            _need(all(isinstance(n, int) for n in output["len"]), f"{where}.len is malformed")
        elif kind == "ema":
            for key in ("key_params", "key_buffers"):
                _need(isinstance(output.get(key), list), f"{where}.{key} is not a list")
                for tensor in output[key]:
                    _tensor(tensor, where)
            _bool(output.get("query_unchanged"), f"{where}.query_unchanged")
        elif kind == "logits":
            _tensor(output.get("logits"), f"{where}.logits", dtype=torch.float64)
        elif kind == "loss":
            _need(isinstance(output.get("loss"), float), f"{where}.loss is not a number")


# --------------------------------------------------------------------------- builder


def _builder(data, options: GradeOptions) -> None:
    _entries(data, schema.BuilderRecord, "the builder record")
    runs = [(name, data.get(name)) for name in ("run", "mlp", "ragged")]
    ranks = data.get("ranks")
    if ranks is not None:
        _entries(ranks, schema.BuilderRanks, "the two-process run")
        _need(isinstance(ranks.get("runs"), list) and len(ranks["runs"]) <= 2,
              "the two-process run's runs are not a list of at most 2")
        _text_or_none(ranks.get("error"), "the two-process run's error")
        runs += [(f"rank {r}", run) for r, run in enumerate(ranks["runs"])]
    for name, run in runs:
        if run is None:
            continue
        _entries(run, schema.BuilderRun, f"the {name} run")
        if "module" in run:
            _entries(run["module"], schema.BuilderModule, f"the {name} run's module")
        if run.get("initial") is not None:
            _entries(run["initial"], schema.BuilderState, f"the {name} run's initial state")
        steps = run.get("steps", [])
        _need(isinstance(steps, list), f"the {name} run's steps are not a list")
        for t, step in enumerate(steps):
            where = f"the {name} run's step {t}"
            _entries(step, schema.BuilderStep, where)
            for state, record_type in (("before", schema.BuilderState),
                                       ("after_forward", schema.BuilderState),
                                       ("after_step", schema.EncoderParameters)):
                if step.get(state) is not None:
                    _entries(step[state], record_type, f"{where}.{state}")
            for e, event in enumerate(step.get("events") or []):
                _entries(event, schema.BuilderForward, f"{where}'s forward {e}")
            pairs = step.get("pairs")
            if pairs is not None:
                _need(isinstance(pairs, list) and len(pairs) == 2,
                      f"{where}'s pairs are not a list of two")
                for i, pair in enumerate(pairs):
                    _need(isinstance(pair, dict) and set(pair) == {"logits", "labels"},
                          f"{where}'s pair {i} is not {{logits, labels}}")
                    _tensor(pair["logits"], f"{where}'s pair {i} logits", ndim=2)
                    _tensor(pair["labels"], f"{where}'s pair {i} labels")
            if "loss_returned" in step:
                _bool(step["loss_returned"], f"{where}.loss_returned")
    try:
        from moco_ref.observe.builder_probe import default_builder_probe
    except ImportError:
        return
    probe = default_builder_probe(options)
    for name, run in runs:
        if name in ("run", "ragged", "rank 0", "rank 1") and isinstance(run, dict):
            _builder_forwards(name, run, probe)
    if "probe" in data:
        expected = default_builder_probe(options).to_dict()
        _need(data["probe"] == expected,
              f"the record names probe {data['probe']}, the grader ran {expected}")
