"""What a submission must define and return: LAB 07's ``train_moco`` value, the
official ``MoCo`` interface, the components protocol.

Long on purpose: the contract family's checks for the three styles sit together, as every
family's do (one module per family, its per-style implementations beside each check).
"""

from __future__ import annotations

import math

import torch

from moco_ref.judge.assertions import (
    CheckFailure,
    NotJudged,
    SubmissionCrashed,
    SubmissionError,
    assert_close,
    at_step,
    describe_value,
    fail,
    fmt_ids,
    fmt_values,
    require,
)
from moco_ref.judge.builder_evidence import BuilderEvidence
from moco_ref.judge.checks.common import builder_where
from moco_ref.judge.components_evidence import ComponentsEvidence
from moco_ref.judge.lab_evidence import LabEvidence
from moco_ref.judge.registry import check
from moco_ref.probe.builder import NO_MLP_OPTION

RETURN_NAMES = ("query", "key", "queue", "queue_ids", "history", "trace", "drift")


LAB_TRACE_KEYS = ("step", "queue_size", "first_source_id", "last_source_id")


def _history(ev: LabEvidence) -> list:
    history = ev.returned.get("history")
    if not isinstance(history, list):
        fail("history must be a list of numbers (mean loss per epoch)", expected="a list",
             got=describe_value(history))
    return history


def _shape(info: dict) -> str:
    if "shape" in info:
        return f"a {info.get('dtype')} tensor of shape {info['shape']}"
    return f"a {info.get('type')}"


RETURNS_SEVEN_VALUES = check(
    "contract-returns-seven-values",
    "train_moco returns LAB 07's seven values",
    points=1,
    contract=(
        "train_moco(initial, x, train, epochs) returns LAB 07's (query, key, queue, queue_ids, "
        "history, trace, drift): two nn.Module encoders, the queue [n, d] float oldest first, "
        "queue_ids [n] integer, history one number per epoch, trace a list of dicts, drift a "
        "number."
    ),
)


@RETURNS_SEVEN_VALUES.judges('lab')
def contract_returns_seven_values_lab(ev: LabEvidence) -> str | None:
    """``train_moco(initial, x, train, epochs)`` returns ``(query, key, queue, queue_ids,
    history, trace, drift)``: two ``nn.Module`` encoders, the queue ``[n, 24]`` float oldest
    first, ``queue_ids`` ``[n]`` integer, ``history`` one number per epoch, ``trace`` a list
    of dicts, ``drift`` a number."""
    returned = ev.returned
    require(returned.get("length") == 7, "train_moco must return LAB 07's 7-tuple",
            expected="(query, key, queue, queue_ids, history, trace, drift)",
            got=f"a {returned.get('type')} of length {returned.get('length')}")
    items = returned["items"]
    for index in (0, 1):
        require(items[index].get("module", False), f"{RETURN_NAMES[index]} must be an nn.Module",
                expected="an nn.Module", got=f"a {items[index]['type']}")
    queue, ids = returned.get("queue"), returned.get("queue_ids")
    require(isinstance(queue, torch.Tensor) and queue.ndim == 2 and queue.is_floating_point(),
            "queue must be a [n, 24] float tensor", expected="a [n, 24] float tensor",
            got=describe_value(queue))
    d = ev.require_run()["projection_dim"]
    require(queue.shape[1] == d, "queue must be returned as [n, d], one key per row",
            expected=f"shape [n, {d}]",
            got=f"shape {list(queue.shape)}" + (" (dim-first: return queue.T)"
                                                  if queue.shape[0] == d else ""))
    require(isinstance(ids, torch.Tensor) and ids.ndim == 1 and not ids.is_floating_point()
            and ids.dtype != torch.bool,
            "queue_ids must be a [n] integer tensor", expected="a [n] int64 tensor",
            got=describe_value(ids))
    require(len(ids) == len(queue), "queue_ids must hold one id per queued key",
            expected=f"{len(queue)} ids", got=f"{len(ids)}")
    history = returned.get("history")
    require(isinstance(history, list) and all(isinstance(v, (int, float)) for v in history),
            "history must be a list of numbers (mean loss per epoch)",
            expected="a list of floats", got=describe_value(history))
    trace = returned.get("trace")
    require(isinstance(trace, list) and all(isinstance(v, dict) for v in trace),
            "trace must be a list of dicts", expected="a list of dicts", got=describe_value(trace))
    drift = returned.get("drift")
    require(isinstance(drift, (int, float)) and not isinstance(drift, bool),
            "drift must be a number", expected="a float", got=describe_value(drift))
    return None


BATCH_SIZE = check(
    "contract-batch-size",
    "each epoch visits the training ids once, in batches",
    points=1,
    contract=(
        "Every epoch cuts the shuffled training ids into batches — of any sizes — and visits "
        "each training id at most once, leaving out fewer than one batch's worth (a dropped "
        "last partial batch); a batch size the assignment pins (--expect-batch-size) is the "
        "largest batch."
    ),
)


@BATCH_SIZE.judges('lab')
def contract_batch_size_lab(ev: LabEvidence) -> str | None:
    """Every epoch visits only training ids, each at most once, and all of them but fewer
    than the largest batch (the official loop drops the last partial batch; unequal batches,
    e.g. ``array_split``, are as legitimate as equal ones); when the assignment pins the batch
    size (``--expect-batch-size``) that is the largest batch."""
    size = ev.batch_size
    train = set(ev.require_run()["train"].tolist())
    _fail_epochs_without_steps(ev)
    sizes_seen = set()
    for epoch in range(ev.epochs_observed):
        steps = [s for s in ev.steps if s.epoch == epoch]
        sizes_seen.update(len(s.ids) for s in steps)
        seen = [i for s in steps for i in s.ids.tolist()]
        outside = set(seen) - train
        require(not outside, "batches hold ids that are not training ids",
                where=f"in epoch {epoch}", expected="ids of `train` only",
                got=f"{len(outside)} other ids, e.g. {fmt_ids(torch.tensor(sorted(outside)[:8]))}")
        require(len(seen) == len(set(seen)), "an epoch visits a training image more than once",
                where=f"in epoch {epoch}", expected="each id of `train` at most once",
                got=f"{len(seen)} ids, {len(set(seen))} distinct")
        missing = len(train) - len(set(seen))
        require(missing < size, "an epoch leaves out more training images than one batch",
                where=f"in epoch {epoch}",
                expected=f"all {len(train)} ids of `train` (or all but a dropped last batch, "
                         f"fewer than {size})", got=f"{len(set(seen))} ids, {missing} left out")
    pinned = ev.options.expect_batch_size
    if pinned is not None:
        require(size == pinned, "the batch size is not the assignment's", where="over the run",
                expected=f"batches of {pinned}", got=f"batches of up to {size}")
    if len(sizes_seen) > 2:
        return f"batches of {', '.join(map(str, sorted(sizes_seen, reverse=True)))}"
    return f"batch size {size}"


def _fail_epochs_without_steps(ev: LabEvidence) -> None:
    """The probe asks for ``epochs`` epochs; steps seen in fewer are told by what history
    says of the loop: one entry per asked epoch means the loop ran but found no batch (an
    iterator or generator made once, before it, used up by the first epoch); fewer entries
    mean the loop itself ran fewer times."""
    requested, observed = ev.probe.epochs, ev.epochs_observed
    if observed >= requested:
        return
    history = ev.returned.get("history")
    entries = len(history) if isinstance(history, list) else 0
    steps = len(ev.steps)
    later = f"epoch {observed}" if requested - observed == 1 else \
        f"epochs {observed}–{requested - 1}"
    if entries == requested:
        fail(f"the batches come from one iterator or generator made before the epoch loop: the "
             f"first epoch uses it up, so {later} run no step (their history entries are means "
             "of nothing)", where=f"from epoch {observed} on",
             expected=f"a fresh pass over the training ids in each of the {requested} epochs "
                      "(make the batches inside the epoch loop)",
             got=f"{steps} steps, all in the first {observed} epoch(s); {later} trained nothing")
    fail(f"train_moco trains {observed} epoch(s), not the {requested} it is asked for (its "
         "epochs argument is not what bounds the loop)", where="over the run",
         expected=f"{requested} epochs (the probe passes epochs={requested})",
         got=f"{steps} steps in {observed} epoch(s), history of {entries} entries")


HISTORY_EPOCH_MEANS = check(
    "contract-history-epoch-means",
    "history holds each epoch's mean loss",
    points=1,
    contract=(
        "history holds one entry per epoch: the mean over that epoch's steps of the loss each "
        "step minimized."
    ),
)


@HISTORY_EPOCH_MEANS.judges('lab')
def contract_history_epoch_means_lab(ev: LabEvidence) -> str | None:
    """``history`` has one entry per epoch, the mean over that epoch's steps of the loss the
    step minimized, as recomputed from the recorded q, k and queue."""
    history = _history(ev)
    epochs = ev.probe.epochs
    require(len(history) == epochs, "history must hold one mean loss per epoch",
            expected=f"{epochs} values (the probe trains {epochs} epochs)",
            got=f"{len(history)}: {fmt_values(history)}")
    diagnosis = ev.loss_diagnosis
    if diagnosis.steps_where("mask", ("positive-too",)):
        return "values not compared: with the positive masked the loss is set by the mask constant"
    compared = 0
    for epoch in range(epochs):
        steps = [s.index for s in ev.steps if s.epoch == epoch]
        forms = [diagnosis.form_at(t) for t in steps]
        losses = [diagnosis.steps[t].loss for t in steps]
        # an epoch whose loss the grader cannot recompute is I8's charge, not this check's;
        # an infinite recomputed loss (a label on a masked column) is set by the mask constant
        if not steps or any(f is None for f in forms) or any(
                v is None or not math.isfinite(v) for v in losses):
            continue
        compared += 1
        expected = sum(losses) / len(losses)
        got = history[epoch]
        if not math.isclose(got, expected, rel_tol=1e-4, abs_tol=1e-5):
            fail("history is not the mean loss of each epoch",
                 where=f"for epoch {epoch} ({len(losses)} steps)",
                 expected=f"{expected:.6g} (mean of the recomputed step losses "
                          f"{fmt_values(losses, 4)})", got=f"{got:.6g}")
    if not compared:
        raise NotJudged("I8-loss-matches-recomputation",
                        "no epoch's loss values could be recomputed")
    return None


TRACE_MATCHES_RUN = check(
    "contract-trace-matches-run",
    "trace describes the queue after the first steps",
    points=1,
    contract=(
        "trace holds one dict per first step (step, queue_size, first_source_id, "
        "last_source_id) describing the queue right after that step's enqueue."
    ),
)


@TRACE_MATCHES_RUN.judges('lab')
def contract_trace_matches_run_lab(ev: LabEvidence) -> str | None:
    """``trace`` is a non-empty list of dicts for the first steps; when it uses LAB 07's keys
    (``step``, ``queue_size``, ``first_source_id``, ``last_source_id``) their values are the
    queue's after that step, as the submission's own queue rule produced it."""
    trace = ev.returned.get("trace")
    require(isinstance(trace, list) and len(trace) > 0 and all(isinstance(e, dict) for e in trace),
            "trace must be a non-empty list of dicts for the first steps",
            expected="[{'step': 0, 'queue_size': …, …}, …]", got=describe_value(trace)
            if not isinstance(trace, list) else f"{len(trace)} entries")
    require(len(trace) <= len(ev.steps), "trace has more entries than there were steps",
            expected=f"at most {len(ev.steps)}", got=len(trace))
    queue = ev.queue
    stored_id = _stored_ids(queue)
    buffer_rows = _zero_initialized_rows(ev)
    for index, entry in enumerate(trace):
        if not all(key in entry for key in LAB_TRACE_KEYS):
            continue
        positions, ids = queue.held_after(index + 1)
        if not len(positions):  # the queue held nothing: only its size can be compared
            require(entry["queue_size"] == 0, "trace does not describe the queue the run kept",
                    where=f"trace[{index}]", expected="queue_size 0 (the queue never held a key)",
                    got=f"queue_size {entry['queue_size']!r}")
            continue
        expected = {"step": index, "queue_size": len(positions),
                    "first_source_id": int(ids[0]), "last_source_id": int(ids[-1])}
        if stored_id is not None:  # ids the queue does not keep faithfully are I3's charge
            for key, position in (("first_source_id", positions[0]),
                                  ("last_source_id", positions[-1])):
                expected[key] = stored_id.get(int(position), entry[key])
        got = {key: entry[key] for key in LAB_TRACE_KEYS}
        if buffer_rows and len(positions) < buffer_rows:
            # the buffer read whole, unfilled rows first: I8 charges that, not the trace
            whole = dict(expected, queue_size=buffer_rows,
                         first_source_id=entry["first_source_id"])
            expected = whole if got == whole else expected
        if got != expected:
            fail("trace does not describe the queue the run kept",
                 where=f"for trace entry {index} "
                       f"({at_step(index, ev.steps[index].ids, after=True)})",
                 expected=expected, got=got)
    return None


def _zero_initialized_rows(ev: LabEvidence) -> int | None:
    """The rows of a queue that starts as that many zero rows and is read whole (the loss form
    ``zero-initialized``, I8's charge), or None: its trace may then count the unfilled rows."""
    try:
        diagnosis = ev.loss_diagnosis
    except SubmissionError:
        return None
    if not diagnosis.steps_where("negatives", ("zero-initialized",)):
        return None
    return ev.queue.capacity


def _stored_ids(queue) -> dict[int, int] | None:
    """When the returned ids follow no queue rule (stored lossily, out of step), the id the
    returned queue shows for each arrival it still holds; None when the ids are faithful."""
    if queue.id_rule is not None or queue.id_views is not None:
        return None
    return {int(p): int(i) for p, i in zip(queue.positions.tolist(), queue.ids.tolist())
            if p >= 0}


DRIFT_RECOMPUTED = check(
    "contract-drift-recomputed",
    "drift is the change of the first query parameter",
    points=1,
    contract=(
        "drift is the norm of the change of the first query-encoder parameter over the run."
    ),
)


@DRIFT_RECOMPUTED.judges('lab')
def contract_drift_recomputed_lab(ev: LabEvidence) -> str | None:
    """``drift`` is ‖θ − θ₀‖ for the first parameter of ``query.encoder``: its value after
    training minus its value in ``initial``, recomputed from the returned query encoder."""
    ev.require_finite("drift")
    drift = ev.returned.get("drift")
    require(isinstance(drift, (int, float)) and not isinstance(drift, bool),
            "drift must be a number", expected="a float", got=describe_value(drift))
    final = ev.returned.get("query_params")
    if not isinstance(final, torch.Tensor):
        raise SubmissionError("train_moco returned no query encoder to recompute drift from")
    name, piece = next((n, s) for n, s in ev.segments if n.startswith("encoder."))
    initial = ev.require_run()["initial_params"]
    expected = float((final[piece].to(torch.float64) - initial[piece].to(torch.float64)).norm())
    require(math.isclose(drift, expected, rel_tol=1e-4, abs_tol=1e-6),
            "drift is not the norm of the change of query.encoder's first parameter",
            where=f"for {name}", expected=f"{expected:.6g}", got=f"{drift:.6g}")
    return None


BUILDER_INTERFACE = check(
    "contract-builder-interface",
    "MoCo has the official constructor, buffers and forward",
    points=1,
    contract=(
        "MoCo(base_encoder, dim, K, m, T, mlp) builds encoder_q and encoder_k from "
        "base_encoder(num_classes=dim) (or from another num_classes, then replaces fc by a "
        "head of width dim), registers the buffers queue [dim, K] (random unit-norm "
        "columns) and queue_ptr [1], "
        "and forward(im_q, im_k) returns (logits [N, 1+K], labels [N])."
    ),
)


def _head_widths(module: dict) -> dict[str, int | None]:
    """The output width of each encoder's ``fc`` as built: the ``out_features`` of its last
    Linear (None when it has none, or the encoder is missing)."""
    widths: dict[str, int | None] = {}
    for role in ("q", "k"):
        linears = module.get(f"fc_linear_{role}") or []
        widths[role] = int(linears[-1][1]) if linears else None
    return widths


def _construction(ev: BuilderEvidence) -> str | None:
    """What the constructor built, judged before any training. The encoders are judged by
    what they output: built by ``base_encoder(num_classes=dim)``, or built with another
    ``num_classes`` (a pretrained classifier) and then given an ``fc`` head of width ``dim``.
    Returns a note for the latter."""
    module, p = ev.module, ev.probe
    calls = module.get("factory_calls", [])
    widths = _head_widths(module)
    as_asked = bool(calls) and all(c["num_classes"] == p.dim for c in calls)
    rebuilt = bool(calls) and all(widths[role] == p.dim for role in ("q", "k"))
    got = "no call" if not calls else f"num_classes {[c['num_classes'] for c in calls]}"
    if calls and not as_asked:
        got += ", " + " and ".join(
            f"encoder_{role}.fc of width {width}" if width is not None
            else f"encoder_{role} without a Linear fc" for role, width in widths.items())
    require(as_asked or rebuilt,
            "the encoders must be built by base_encoder(num_classes=dim), or given an fc head "
            "of width dim after they are built: they output dim features",
            expected=f"base_encoder(num_classes={p.dim}), or fc replaced by a Linear(·, "
                     f"{p.dim}) head",
            got=got)
    for role in ("q", "k"):
        require(module.get(f"encoder_{role}", False), f"MoCo has no encoder_{role} module",
                expected=f"self.encoder_{role} = base_encoder(num_classes=dim)",
                got="no such nn.Module attribute")
    buffers = module.get("buffers", [])
    missing = [name for name in ("queue", "queue_ptr") if name not in buffers]
    if _keeps_no_queue(module):
        fail("MoCo keeps no queue: the module has no queue (commented out or never made), so "
             "its negatives cannot be the dictionary of earlier keys MoCo contrasts with; what "
             "is left is in-batch contrast of the current keys",
             expected=f"self.register_buffer('queue', normalize(torch.randn({p.dim}, {p.K}), "
                      "dim=0)) and a queue_ptr buffer, the keys enqueued after each step",
             got="no attribute queue or queue_ptr on the built module")
    require(not missing, "queue and queue_ptr must be registered buffers (register_buffer: they "
            "follow .cuda()/.to() and are saved in state_dict)",
            expected="buffers queue and queue_ptr", got=f"{', '.join(missing)} not registered")
    queue, ptr = module["queue"], module["queue_ptr"]
    require(queue.get("shape") == [p.dim, p.K] and queue.get("dtype", "").startswith(
        ("float", "bfloat")), "the queue buffer must be [dim, K], one key per column",
            expected=f"a float tensor of shape [{p.dim}, {p.K}]", got=_shape(queue))
    require(ptr.get("shape") in ([1], []) and ptr.get("dtype", "").startswith(("int", "uint")),
            "queue_ptr must hold one integer (the next column to overwrite)",
            expected="torch.zeros(1, dtype=torch.long)", got=_shape(ptr))
    initial = ev.constructed()["initial"].get("queue")
    if isinstance(initial, torch.Tensor) and list(initial.shape) == [p.dim, p.K]:
        norms = initial.to(torch.float64).norm(dim=0)  # [K], one per key column
        worst = int((norms - 1).abs().argmax())
        require(bool(((norms - 1).abs() <= 1e-4).all()),
                "the initial queue must hold unit-norm random keys, one per column (normalize "
                "the random queue along dim, dim=0 of [dim, K]), like every key enqueued later",
                where="after construction", expected="every column of norm 1",
                got=f"column {worst} of norm {float(norms[worst]):.4g} (norms "
                    f"{fmt_values(norms, limit=3)})")
    if as_asked:
        return None
    sizes = sorted({c["num_classes"] for c in calls})
    return (f"encoders built with num_classes {', '.join(map(str, sizes))}, then given an fc "
            f"head of width dim = {p.dim}")


def _keeps_no_queue(module: dict) -> bool:
    """Whether the built module has neither a queue nor a queue_ptr of any kind."""
    return all(module.get(name, {}).get("type") == "NoneType" for name in ("queue", "queue_ptr"))


def _training_crash(ev: BuilderEvidence):
    try:
        ev.require_run()
    except SubmissionCrashed as crash:
        return crash
    return None


@BUILDER_INTERFACE.judges('builder')
def contract_builder_interface_builder(ev: BuilderEvidence) -> str | None:
    """``MoCo(base_encoder, dim, K, m, T, mlp)`` builds ``encoder_q`` and ``encoder_k`` with
    ``base_encoder(num_classes=dim)``, registers the buffers ``queue`` ``[dim, K]`` (float)
    and ``queue_ptr`` (one integer), and ``forward(im_q, im_k)`` returns ``(logits [B, 1 + K]
    float, labels [B] int64)``."""
    try:
        note = _construction(ev)
    except CheckFailure as failure:
        crash = _training_crash(ev)
        if crash is None:
            raise
        # the wrong build is the root cause of the crash that followed: told here, once
        fail(failure.misconception, where=failure.where, expected=failure.expected,
             got=f"{failure.got}; and so {crash}", details={"tells_crash": crash.part})
    p = ev.probe
    step = ev.steps[0]
    declared = ev.options.variant
    require(declared in (None, ev.variant),
            f"the assignment asks for a {declared} module (--variant {declared})",
            where=builder_where(0),
            expected=("forward returning two (logits, labels) pairs, or a loss of two halves "
                      "(each view a query against the other view's key)"
                      if declared == "symmetric" else "forward returning one (logits, labels)"),
            got=f"a {ev.variant} module ({ev.record['run']['steps'][0].get('returned')})")
    require(list(step.logits.shape) == [p.batch, 1 + p.K],
            "forward must return logits [B, 1 + K]: the positive, then one column per queue entry",
            where=builder_where(0), expected=f"shape [{p.batch}, {1 + p.K}]",
            got=f"shape {list(step.logits.shape)}")
    labels = step.labels
    require(labels.shape == (p.batch,) and labels.dtype == torch.int64,
            "forward must return labels [B] int64 (the class index of the positive)",
            where=builder_where(0), expected=f"an int64 tensor of shape [{p.batch}]",
            got=f"a {str(labels.dtype).replace('torch.', '')} tensor of shape "
                f"{list(labels.shape)}")
    return note


BUILDER_MLP = check(
    "contract-builder-mlp",
    "mlp=True adds an MLP head to both encoders",
    points=1,
    contract=(
        "With mlp=True both encoders get the same MLP head (Linear, ReLU, then the original "
        "fc), sized from the encoder's own fc layer; with mlp=False neither has one."
    ),
)


def _mlp_head_width(ev: BuilderEvidence, plain) -> None:
    """The head's first Linear takes the features the encoder's fc takes (its in_features,
    ``fc.weight.shape[1]``): judged from the built module, before its training says more."""
    run = ev.record.get("mlp") or {}
    module = run.get("module") or {}
    for role in ("q", "k"):
        plain_fc = plain.get(f"fc_linear_{role}") or []
        head = module.get(f"fc_linear_{role}") or []
        if len(plain_fc) != 1 or len(head) < 2:
            continue
        width, dim = plain_fc[0]
        if head[0][0] != width:
            shape_0 = " (fc.weight.shape[0], the output axis)" if head[0][0] == dim else ""
            fail("the MLP head's hidden layer is sized from the wrong axis of fc.weight: "
                 "nn.Linear stores it as [out_features, in_features], so the width of the "
                 "features fc receives is fc.weight.shape[1]",
                 where=f"encoder_{role} built with mlp=True",
                 expected=f"Linear({width}, {width}) → ReLU → fc Linear({width}, {dim})",
                 got=f"Linear{tuple(head[0])}{shape_0} in front of an fc taking {width} "
                     "features")


# layers whose order in ``fc.modules()`` is their order in the forward when the only
# container among them is nn.Sequential
_SEQUENTIAL_LAYERS = frozenset({"Sequential", "Linear", "ReLU", "BatchNorm1d", "LayerNorm",
                                "Dropout", "Identity"})


def _relu_between_linears(kinds: list[str]) -> bool:
    """Whether the head is Linear → ReLU → Linear: a ReLU and two Linears, and, where the
    listed order is the forward's (a plain nn.Sequential), the ReLU after one Linear and
    before another (a ReLU in front of both Linears leaves the head one linear map)."""
    linears = [i for i, kind in enumerate(kinds) if kind == "Linear"]
    if len(linears) < 2 or "ReLU" not in kinds:
        return False
    if not set(kinds) <= _SEQUENTIAL_LAYERS:  # a module of its own: its forward may reorder
        return True
    return any(kind == "ReLU" and linears[0] < i < linears[-1] for i, kind in enumerate(kinds))


def _weight_matrices(info: dict) -> int:
    """The Linear layers in encoder_q's path: its 2-D parameter tensors (a convolution's are
    4-D, a norm's 1-D). A count of layers, never of parameters: a bottleneck head can hold
    fewer parameters than the one Linear it replaces, depending on the probe's dim."""
    return sum(len(entry.get("shape", [])) == 2 for entry in info.get("layout_q", []))


@BUILDER_MLP.judges('builder')
def contract_builder_mlp_builder(ev: BuilderEvidence) -> str | None:
    """``MoCo(..., mlp=True)`` turns the last layer of both encoders into an MLP (MoCo v2:
    ``fc`` becomes Linear → ReLU → Linear, so there are more Linear layers than with
    ``mlp=False``), makes θk a copy of that θq, and trains like ``mlp=False``."""
    plain = ev.module
    ev.require_run()  # the plain run's own failure is every check's error, not this one's
    if _keeps_no_queue(plain):
        raise NotJudged("contract-builder-interface", "the module keeps no queue, so no head "
                        "option can give logits [B, 1 + K]")
    if (ev.record.get("mlp") or {}).get("stage") == NO_MLP_OPTION:
        fail("the module has no MoCo v2 head option: MoCo(...) takes no mlp parameter",
             expected="MoCo(base_encoder, dim, K, m, T, mlp=False); mlp=True puts Linear → ReLU "
                      "before each encoder's fc",
             got="a constructor without mlp (graded with its other parameters)")
    _mlp_head_width(ev, plain)
    try:
        run = ev.require_run("mlp")
    except SubmissionError as error:  # mlp=False works: the crash is the mlp option's
        fail("the module fails with mlp=True although it works with mlp=False", got=str(error))
    module = run.get("module", {})
    count = {name: _weight_matrices(info) for name, info in (("plain", plain), ("mlp", module))}
    require(count["mlp"] > count["plain"], "mlp=True did not add a hidden layer to the encoders",
            expected=f"more than the {count['plain']} Linear layer(s) of encoder_q with "
                     "mlp=False",
            got=f"{count['mlp']} Linear layer(s)")
    for role in ("q", "k"):
        kinds = module.get(f"fc_{role}", [])
        require(_relu_between_linears(kinds),
                f"with mlp=True encoder_{role}.fc must be an MLP (Linear → ReLU → Linear): "
                "without a ReLU between two Linear layers the head is one linear map",
                expected="fc = nn.Sequential(nn.Linear(w, w), nn.ReLU(), fc)",
                got=f"fc made of {' → '.join(kinds) if kinds else 'nothing'}")
    require(module.get("layout_k") == module.get("layout_q"),
            "with mlp=True encoder_k does not have encoder_q's parameters",
            expected="the same head on both encoders",
            got=f"{len(module.get('layout_k', []))} vs {len(module.get('layout_q', []))} "
                "parameter tensors")
    first = run["steps"][0]
    key = next((e for e in first["events"] if e["role"] == "k"), None)
    if key is None:
        raise SubmissionError("with mlp=True encoder_k never ran in the first step")
    assert_close(key["params_k"], run["initial"]["params_q"],
                 "with mlp=True the key encoder did not start as a copy of the query encoder "
                 "(copy the parameters after adding the MLP head)", rtol=1e-5, atol=1e-6,
                 where="at the first key forward, θk vs θq as built:")
    logits = (first.get("pairs") or [first])[0]["logits"]  # a symmetric module's first half
    require(list(logits.shape) == [ev.view_batch, 1 + ev.probe.K],
            "with mlp=True forward must still return logits [B, 1 + K]", where=builder_where(0),
            expected=f"shape [{ev.view_batch}, {1 + ev.probe.K}]",
            got=f"shape {list(logits.shape)}")
    return f"{count['mlp'] - count['plain']} Linear layer(s) added to the head"


COMPONENTS_DEFINED = check(
    "contract-components-defined",
    "the components protocol is defined",
    points=1,
    contract=(
        "A components submission defines KeyQueue, momentum_update, contrastive_logits and "
        "info_nce_loss with the reference's signatures (COMPONENTS.md)."
    ),
)


@COMPONENTS_DEFINED.judges('components')
def contract_components_defined_components(ev: ComponentsEvidence) -> str | None:
    """The submission defines ``KeyQueue``, ``momentum_update``, ``contrastive_logits`` and
    ``info_nce_loss`` with the reference's signatures (COMPONENTS.md)."""
    defined = ev.record.get("defined", {})
    missing = [name for name, ok in defined.items() if not ok]
    require(not missing, "the components protocol is incomplete",
            expected="KeyQueue, momentum_update, contrastive_logits, info_nce_loss",
            got=f"missing {', '.join(missing)}")
    return None


FRESH_GRADIENTS = check(
    "contract-fresh-gradients",
    "each update uses this step's gradient only",
    points=1,
    contract=(
        "The query encoder is trained on each step's loss alone: its gradients are cleared "
        "between steps (optimizer.zero_grad()), so an update never carries earlier steps' "
        "gradients; and the whole query model is trained: every parameter the loss reaches "
        "is updated (the optimizer holds them all)."
    ),
)
ACCUMULATION_RTOL = 1e-3  # recomputed vs recorded parameter gradients


@FRESH_GRADIENTS.judges('lab')
def contract_fresh_gradients_lab(ev: LabEvidence) -> str | None:
    """Between two steps θq's ``.grad`` holds this step's gradient (recomputed through the
    probe model from the recorded parameters, inputs and output gradient) or nothing — not
    the sum of this step's and the earlier ones'. (Gradients rescaled in place, e.g. by
    clipping, are not charged: only an identified accumulation is.)"""
    for item in ev.query_gradients:
        if item.after is None or item.before is None:
            continue
        scale = float(item.fresh.norm()) or 1.0
        fresh = float((item.after - item.fresh).norm()) / scale
        summed = float((item.after - (item.before + item.fresh)).norm()) / scale
        if fresh > ACCUMULATION_RTOL and summed <= ACCUMULATION_RTOL and \
                float(item.before.norm()) > ACCUMULATION_RTOL * scale:
            fail("the query encoder's gradients accumulate across steps (optimizer.zero_grad() "
                 "missing, or called after backward?): each update also applies every earlier "
                 "step's gradient", where=f"after step {item.step}",
                 expected=f"θq.grad = this step's gradient (norm {scale:.4g})",
                 got=f"θq.grad = this step's gradient + the previous .grad (norm "
                     f"{float(item.after.norm()):.4g})",
                 details={"disables": ["I8"]})  # the step no longer applies the loss's gradient
    _fail_untrained_parameters(ev)
    return None


def _fail_untrained_parameters(ev: LabEvidence) -> None:
    """A parameter of the query model that the loss's gradient reaches at some step but that
    never changes over the run is outside the optimizer (``SGD(query.encoder.parameters())``:
    the projection head never trained)."""
    gradients = ev.query_gradients
    steps = ev.steps
    if not gradients or len(steps) < 2:
        return
    from moco_ref.probe.lab import ProbeNet

    untrained, start = [], 0
    for name, parameter in ProbeNet().named_parameters():
        span = slice(start, start + parameter.numel())
        start += parameter.numel()
        reached = any(float(item.fresh[span].abs().max()) > 0 for item in gradients)
        moved = any(not torch.equal(later.query_params[span], earlier.query_params[span])
                    for earlier, later in zip(steps, steps[1:]))
        if reached and not moved:
            untrained.append(name)
    if untrained and ev.query_never_trained:
        _fail_query_never_trained(gradients, len(steps))
    if untrained:
        fail("part of the query model is never trained: the loss's gradient reaches these "
             "parameters but no step updates them (the optimizer is built over part of the "
             "query model, e.g. query.encoder only, so the projection head never trains)",
             where=f"over the {len(steps)} steps",
             expected="every parameter of the query model the loss reaches updated "
                      "(optimizer over query.parameters())",
             got="never updated: " + ", ".join(untrained))


def _fail_query_never_trained(gradients, steps: int) -> None:
    """No parameter of the query model ever changed although the loss's gradient reached it:
    nothing is learned, so the loss (I8) is charged with it, as for accumulated gradients.
    Told apart by what ``.grad`` held when the next step began: nothing (or zeros) means the
    gradient was cleared before ``step()`` could use it."""
    reached = [item for item in gradients if float(item.fresh.abs().max()) > 0]
    cleared = bool(reached) and all(
        item.after is None or float(item.after.abs().max()) == 0 for item in reached)
    if cleared:
        fail("the query model never trains: its gradients are cleared between loss.backward() "
             "and optimizer.step() (optimizer.zero_grad() or .grad = None after backward), so "
             "every step updates nothing", where=f"over the {steps} steps",
             expected="zero_grad(), then loss.backward(), then optimizer.step(): θq moves by "
                      "the loss's gradient",
             got=f"θq unchanged at every step; .grad empty when the next step began, at each "
                 f"of the {len(reached)} steps whose gradient reached θq",
             details={"disables": ["I8"]})
    fail("the query model never trains: optimizer.step() changes none of its parameters (no "
         "step() call, an optimizer over other parameters, or a learning rate of 0)",
         where=f"over the {steps} steps",
         expected="θq moved by the loss's gradient at each optimizer step",
         got="θq unchanged at every step while the loss's gradient reached it",
         details={"disables": ["I8"]})
