"""The refactor guard: record a submission's trajectory on the grader's fixed probe, and find
the first step where two recordings part.

A trajectory is plain JSON: per training step the batch's source ids, the query encoder's raw
projection ``q``, the key encoder's ``k``, the gradient the loss sent into ``q``, the loss the
reference computes from those (with the FIFO dictionary of the keys seen so far), and both
encoders' parameters at the key forward; then the returned queue, ids, history and final
parameters. ``compare`` walks two of them in that order and stops at the first quantity that
differs beyond the tolerance (bitwise by default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from moco_ref.core.tolerance import NotComparable, mismatch
from moco_ref.probe.options import GradeOptions
from moco_ref.tools.trajectory_file import (  # noqa: F401 (the guard's file API)
    MAX_TRAJECTORY_BYTES,
    TrajectoryTooLarge,
    load,
    save,
)
from moco_ref.tools.trajectory_runs import crash_of, crash_text, other_runs, plain, start_of

FORMAT = "moco-ref-trajectory/1"
STEP_QUANTITIES = ("ids", "q", "k", "grad", "loss", "query_params", "key_params")
BUILDER_STEP_QUANTITIES = ("q", "k", "logits", "loss", "queue", "query_params", "key_params")
FINAL_QUANTITIES = ("queue", "queue_ids", "history", "drift", "query_params", "key_params")



def trajectory_head(style: str, source: str) -> dict:
    from moco_ref import __version__

    return {"format": FORMAT, "submission": source, "style": style,
            "provenance": {"moco_ref": __version__, "torch": torch.__version__}}


def trajectory_from_observations(observations: dict, style: str, source: str = "") -> dict:
    """The trajectory of a ``lab`` observation record; other styles keep their whole record
    (compared in its own structure)."""
    head = trajectory_head(style, source)
    if style == "builder":
        return {**head, **builder_trajectory(observations)}
    if style != "lab":
        return {**head, "record": plain(observations)}
    from moco_ref.judge.lab_evidence import LabEvidence

    evidence = LabEvidence(observations, GradeOptions(style="lab"))
    losses = _reference_losses(evidence)
    steps = [
        {"step": s.index, "epoch": s.epoch, "ids": plain(s.ids), "q": plain(s.z),
         "k": plain(s.k), "grad": plain(s.grad), "loss": losses[t],
         "query_params": plain(s.query_params), "key_params": plain(s.key_params)}
        for t, s in enumerate(evidence.steps)
    ]
    returned = evidence.returned
    final = {name: plain(returned.get(name)) for name in ("queue", "queue_ids", "history",
                                                           "drift", "query_params",
                                                           "key_params")}
    return {**head, "steps": steps, "final": final, "laws": _laws(observations, evidence),
            "warmup": plain(observations.get("moco_warmup", {}).get("result"))}


def builder_trajectory(observations: dict, evidence=None, judged=None) -> dict:
    """A ``builder`` module's main run, step by step: the encoders' raw outputs (``q``,
    ``k``: both views stacked for a symmetric module), the returned logits, the loss it
    trained on, the buffer after the forward (one row per key column) and both encoders'
    parameters at the key forward; per step the law it followed. Also the state it started
    from (``start``), every other run the grader makes (``runs``: mlp, K not a multiple of the
    batch, each rank of the two-process run) and where a run crashed, in the user's terms.
    ``evidence``/``judged``: a recording's (``moco_ref.trace``), else the grader's record's."""
    from moco_ref.judge.builder_evidence import BuilderEvidence

    evidence = evidence or BuilderEvidence(observations, GradeOptions(style="builder"))
    record = evidence.record
    head = {"start": start_of(record.get("run")), "runs": other_runs(record),
            "warmup": None}
    try:
        records = evidence.require_run()["steps"]
        steps_seen = evidence.steps
    except Exception as crash:  # noqa: BLE001 - the run crashed: that is its trajectory
        return {**head, "steps": [], "final": None, "laws": None,
                "crash": crash_of(record.get("run"), "the main run", crash)}
    steps = [
        {"step": s.index, "epoch": None, "ids": list(range(len(s.q))), "q": plain(s.q),
         "k": plain(s.k), "logits": plain(s.logits), "loss": records[t].get("loss"),
         "queue": plain(s.queue_after), "query_params": plain(s.query_params),
         "key_params": plain(s.key_params), "inputs": records[t].get("inputs")}
        for t, s in enumerate(steps_seen)
    ]
    last = records[-1]
    final = {"queue": plain(evidence.steps[-1].queue_after), "queue_ids": None,
             "history": None, "drift": None,
             "query_params": plain(last["after_step"]["params_q"]),
             "key_params": plain(last["after_step"]["params_k"])}
    return {**head, "steps": steps, "final": final, "crash": None,
            "laws": _laws(observations, evidence, "builder", judged)}


def _builder_loss_laws(evidence) -> list[str | None]:
    """Per step, the logits form that explains that step alone (None: no known form)."""
    from moco_ref.judge.invariants import describe_logits_form, identify_logits_form

    per_entry = max(1, len(evidence.logit_steps) // max(1, len(evidence.steps)))
    laws = []
    for t in range(len(evidence.steps)):
        entries = evidence.logit_steps[t * per_entry:(t + 1) * per_entry]
        fit = identify_logits_form(entries, evidence.temperature)
        laws.append(describe_logits_form(fit.form) if fit.all_match else None)
    return laws


def _laws(observations: dict, evidence, style: str = "lab", judged=None) -> dict:
    """Which MoCo transition each step followed, judged from that run's own recorded state:
    the loss form (``None``: no known form) and whether the key update obeyed the EMA law;
    plus the run's hyperparameters and the checks it fails."""
    from moco_ref.judge.judge import judge

    results, inferred = judged or judge(observations, style, GradeOptions(style=style))
    per_step = [{"loss": None, "ema": "law"} for _ in evidence.steps]
    try:
        if style == "builder":
            for t, law in enumerate(_builder_loss_laws(evidence)):
                per_step[t]["loss"] = law
        else:
            for t, step in enumerate(evidence.loss_diagnosis.steps):
                per_step[t]["loss"] = None if step.form is None else step.form.describe()
    except Exception:  # noqa: BLE001 - a loss the judge cannot read stays unknown
        pass
    try:
        for update in evidence.ema.updates:
            if not update.final and 0 <= update.step < len(per_step) and (
                    update.moved_outside or update.skipped or not update.fits_law):
                per_step[update.step]["ema"] = "off the EMA law"
    except Exception:  # noqa: BLE001
        pass
    failed = sorted(r.check_id for r in results if r.status.value not in ("passed",
                                                                           "not applicable"))
    rules = {key: inferred.get(key) for key in (
        ("m", "K", "batch_size", "temperature", "order", "variant") if style == "builder"
        else ("m", "capacity", "batch_size"))}
    return {"steps": per_step, "rules": plain(rules), "failed_checks": failed}


def _reference_losses(evidence) -> list[float | None]:
    """−ln p⁺ from the observed q, k and the FIFO of the keys seen before each step: the
    judge's reference form (in-batch negatives while the queue is empty)."""
    from moco_ref.judge.invariants.loss import REFERENCE_FORM, form_gradient

    try:
        inputs = evidence.loss_inputs
    except Exception:  # noqa: BLE001 - a run the reference cannot follow has no losses
        return [None] * len(evidence.steps)
    temperature = evidence.options.temperature
    out = []
    for step in inputs:
        result = form_gradient(REFERENCE_FORM, step, temperature)
        out.append(None if result is None else result[0])
    return out


@dataclass(frozen=True)
class Verdict:
    """How two runs relate: ``identical`` (bitwise), ``rounding`` (the same MoCo transition at
    every step, the trajectories apart only by amplified float rounding), ``start`` (the same
    transitions from a different starting state: the initial queue, the initialisation, the
    images fed) or ``behaviour`` (a run leaves the law, the two follow different laws, or one
    crashes, at ``where``)."""

    kind: str
    where: str = ""
    detail: str = ""
    growth: tuple[float, ...] = ()  # per step, the largest relative difference of k

    def __str__(self) -> str:
        if self.kind == "identical":
            return "identical: bitwise the same trajectory"
        if self.kind == "rounding":
            shown = ", ".join(f"{g:.1e}" for g in self.growth[:3])
            last = f" … {self.growth[-1]:.1e}" if len(self.growth) > 3 else ""
            return (f"equivalent up to rounding: both follow the same MoCo transition at every "
                    f"step ({self.detail}); the keys drift apart only by amplified float "
                    f"rounding, largest relative difference per step {shown}{last}")
        if self.kind == "start":
            return f"a different starting state at {self.where}: {self.detail}"
        return f"behaviour change at {self.where}: {self.detail}"


def classify(a: dict, b: dict) -> Verdict:
    """``a`` against ``b``: identical, equivalent up to rounding, or a behaviour change at the
    first step where one run leaves the law the other follows (or both, differently)."""
    crashed = _crash_difference(a, b)
    if crashed is not None:
        return crashed
    divergence = compare(a, b)
    if divergence is None:
        return Verdict("identical")
    main = compare(a, b, runs=False)
    if main is None:  # the main run is bitwise the same: another run tells them apart
        return _runs_verdict(a, b) or Verdict(
            "rounding", detail=f"the main run bitwise the same; {divergence.where} apart by "
                               f"float rounding only ({divergence.detail})")
    fed = _inputs_difference(a, b)
    if fed is not None:  # the initial state, when it differs too, said first
        start = _start_difference(a, b)
        return Verdict("start", fed.where, f"{start}; {fed.detail}" if start else fed.detail)
    if "laws" not in a or "laws" not in b:
        return Verdict("behaviour", divergence.where, divergence.detail + " (these recordings "
                       "carry no per-step laws: record them again to tell rounding apart)")
    for t, (x, y) in enumerate(zip(a["steps"], b["steps"])):
        if x["ids"] != y["ids"]:  # integers: no rounding explains a different batch
            return Verdict("behaviour", f"{_step_name(t, x)} in the batch's ids",
                           f"A {_brief(x['ids'])}, B {_brief(y['ids'])}")
    if a["final"]["queue_ids"] != b["final"]["queue_ids"]:
        return Verdict("behaviour", "the end of training in queue_ids",
                       _numeric_difference(a["final"]["queue_ids"], b["final"]["queue_ids"],
                                           0.0, 0.0) or "they differ")
    la, lb = a["laws"], b["laws"]
    for t, (x, y) in enumerate(zip(la["steps"], lb["steps"])):
        name = _step_name(t, a["steps"][t] if t < len(a["steps"]) else {"epoch": "?"})
        for quantity, what in (("loss", "the loss"), ("ema", "the key encoder's update")):
            if x[quantity] != y[quantity] or x[quantity] is None:
                shown = {key: ("no known form" if value is None else value)
                         for key, value in (("A", x[quantity]), ("B", y[quantity]))}
                return Verdict("behaviour", f"{name} in {what}",
                               f"A: {shown['A']}; B: {shown['B']}")
    if len(la["steps"]) != len(lb["steps"]):
        return Verdict("behaviour", f"step {min(len(la['steps']), len(lb['steps']))}",
                       f"A has {len(la['steps'])} steps, B has {len(lb['steps'])}")
    for key, value in la["rules"].items():
        other = lb["rules"].get(key)
        if value != other and not (isinstance(value, float) and isinstance(other, float)
                                   and abs(value - other) <= 1e-3 * max(abs(value), 1e-9)):
            return Verdict("behaviour", f"the run's {key.replace('_', ' ')}",
                           f"A: {value}; B: {other}")
    if la["failed_checks"] != lb["failed_checks"]:
        only = sorted(set(la["failed_checks"]) ^ set(lb["failed_checks"]))
        return Verdict("behaviour", "the grader's verdict", f"only one run fails {only}")
    others = _runs_verdict(a, b)
    if others is not None and others.kind == "behaviour":
        return others
    growth = tuple(_relative_gap(x["k"], y["k"]) for x, y in zip(a["steps"], b["steps"]))
    law = "; ".join(sorted({s["loss"] for s in la["steps"] if s["loss"]})) or "the reference"
    start = _start_difference(a, b)
    if start is not None:
        return Verdict("start", "the start", f"{start}; from there both follow the same MoCo "
                       f"transition at every step ({law})", growth)
    return Verdict("rounding", detail=law, growth=growth)


def _crash_difference(a: dict, b: dict) -> Verdict | None:
    """A main run that crashed in one recording (or crashed elsewhere in the other)."""
    x, y = a.get("crash"), b.get("crash")
    if not x and not y:
        return None
    if x and y and (x.get("stage"), x.get("exception")) == (y.get("stage"), y.get("exception")):
        return None if a.get("steps") == b.get("steps") else Verdict(
            "behaviour", x["where"], f"both raised ({crash_text(x)}) after different steps")
    shown = {name: crash_text(c) if c else "ran to the end" for name, c in (("A", x), ("B", y))}
    where = (x or y)["where"]
    stage = (x or y).get("stage") or ""
    return Verdict("behaviour", f"{where}, {stage}" if stage else where,
                   f"A: {shown['A']}; B: {shown['B']}")


# the other runs carry no per-step laws: their values are held to float32 rounding amplified
# over a few steps (a refactor's reordered sums), a behaviour change is far beyond it
OTHER_RUN_ROUNDING = (1e-4, 1e-5)  # rtol, atol


def _runs_verdict(a: dict, b: dict) -> Verdict | None:
    """The first other run (mlp, K not a multiple of the batch, a rank of the two-process run)
    where the two differ: a crash on one side, or its steps apart beyond rounding."""
    runs_a, runs_b = a.get("runs") or {}, b.get("runs") or {}
    for name in list(dict.fromkeys([*runs_a, *runs_b])):
        x, y = runs_a.get(name), runs_b.get(name)
        if x is None or y is None:
            return Verdict("behaviour", (x or y)["where"], "made in one recording only")
        if (x.get("crash") or {}).get("exception") != (y.get("crash") or {}).get("exception"):
            shown = {side: crash_text(run["crash"]) if run.get("crash") else "ran to the end"
                     for side, run in (("A", x), ("B", y))}
            stage = (x.get("crash") or y.get("crash")).get("stage")
            return Verdict("behaviour", f"{x['where']}, {stage}",
                           f"A: {shown['A']}; B: {shown['B']}")
        for t, (sx, sy) in enumerate(zip(x["steps"], y["steps"])):
            for quantity in ("logits", "loss", "queue"):
                difference = _numeric_difference(sx.get(quantity), sy.get(quantity),
                                                 *OTHER_RUN_ROUNDING)
                if difference:
                    return Verdict("behaviour", f"{x['where']}, step {t}: {quantity}",
                                   difference)
        if len(x["steps"]) != len(y["steps"]):
            return Verdict("behaviour", x["where"],
                           f"A has {len(x['steps'])} steps, B has {len(y['steps'])}")
    return None


def _inputs_difference(a: dict, b: dict) -> Verdict | None:
    """Recordings of a user's own loop carry a digest of each step's images: a different
    digest is a different data stream, not a different MoCo."""
    for t, (x, y) in enumerate(zip(a.get("steps") or [], b.get("steps") or [])):
        if x.get("inputs") and y.get("inputs") and x["inputs"] != y["inputs"]:
            return Verdict("start", f"step {t}", (
                f"they are fed different images from step {t} (the data, its order or the "
                "random numbers that make the views are drawn differently): a different "
                "starting state, not a different MoCo; fix the seeds and the data order to "
                "compare the transitions"))
    return None


def _start_difference(a: dict, b: dict) -> str | None:
    """How the states the runs start from differ (the dictionary as built, θq, θk), or None."""
    x, y = a.get("start") or {}, b.get("start") or {}
    said = []
    for name, what in (("queue", "queues"), ("params_q", "initial query encoders (θq)"),
                       ("params_k", "initial key encoders (θk)")):
        difference = _numeric_difference(x.get(name), y.get(name), 0.0, 0.0)
        if difference:
            said.append(f"the runs start from different {what}: {difference}")
    return "; ".join(said) or None


def _step_name(t: int, step: dict, ids: bool = False) -> str:
    """``step 3 (epoch 1, ids [..])`` for a LAB run; ``step 3`` for a module (no epochs)."""
    if step.get("epoch") is None:
        return f"step {t}"
    return f"step {t} (epoch {step['epoch']}" + (f", ids {_brief(step['ids'])})" if ids else ")")


def _relative_gap(x, y) -> float:
    a, b = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(((a - b).abs() / b.abs().clamp_min(1e-12)).max()) if a.numel() else 0.0


@dataclass(frozen=True)
class Divergence:
    where: str  # e.g. "step 3 (epoch 1): k"
    detail: str

    def __str__(self) -> str:
        return f"first divergence at {self.where}: {self.detail}"


def _numeric_difference(a, b, rtol: float, atol: float) -> str | None:
    """How ``a`` differs from ``b`` beyond tolerance (relative to ``b``), or None."""
    if a is None or b is None:
        return None if a is b else f"one side has no value (A: {_brief(a)}, B: {_brief(b)})"
    try:
        found = mismatch(b, a, rtol, atol)
    except NotComparable as reason:
        if reason.shapes is not None:
            return f"shapes differ: A {reason.shapes[1]}, B {reason.shapes[0]}"
        return None if a == b else f"A {_brief(a)} != B {_brief(b)}"
    if found is None:
        return None
    position = f" at index {list(found.index)}" if found.index else ""
    return (f"{found.count} of {found.size} values differ; max abs error {found.max_abs:.3g}, "
            f"max rel error {found.max_rel:.3g}{position} "
            f"(A {found.got:.17g}, B {found.expected:.17g})")


def _brief(value) -> str:
    text = json.dumps(value)
    return text if len(text) < 80 else text[:77] + "..."


def compare(a: dict, b: dict, rtol: float = 0.0, atol: float = 0.0, *,
            runs: bool = True) -> Divergence | None:
    """The first place where trajectories ``a`` and ``b`` differ, or None (``runs``: the
    other runs a module's recording holds too)."""
    for document, name in ((a, "A"), (b, "B")):
        if document.get("format") != FORMAT:
            raise ValueError(f"{name} is not a moco-ref trajectory (format {FORMAT!r})")
    if a["style"] != b["style"]:
        return Divergence("the style", f"A is {a['style']}, B is {b['style']}")
    if "record" in a:
        return _compare_tree(a["record"], b.get("record"), "record", rtol, atol)
    quantities = BUILDER_STEP_QUANTITIES if a["style"] == "builder" else STEP_QUANTITIES
    for t, (x, y) in enumerate(zip(a["steps"], b["steps"])):
        for quantity in quantities:
            difference = _numeric_difference(x.get(quantity), y.get(quantity), rtol, atol)
            if difference:
                return Divergence(f"{_step_name(t, x, ids=True)}: "
                                  f"{quantity}", difference)
    if len(a["steps"]) != len(b["steps"]):
        return Divergence(f"step {min(len(a['steps']), len(b['steps']))}",
                          f"A has {len(a['steps'])} steps, B has {len(b['steps'])}")
    for quantity in FINAL_QUANTITIES:
        if a.get("final") is None or b.get("final") is None:
            if a.get("final") is not b.get("final"):
                return Divergence("the end of training", "one run has no end (it crashed)")
            break
        difference = _numeric_difference(a["final"][quantity], b["final"][quantity], rtol, atol)
        if difference:
            return Divergence(f"the end of training: {quantity}", difference)
    difference = _numeric_difference(_flat_warmup(a), _flat_warmup(b), rtol, atol)
    if difference:
        return Divergence("moco_warmup", difference)
    if runs:
        found = _compare_tree(a.get("runs") or {}, b.get("runs") or {}, "runs", rtol, atol)
        if found:
            return found
        return _compare_tree(a.get("crash") or {}, b.get("crash") or {}, "crash", rtol, atol)
    return None


def _flat_warmup(document: dict):
    return json.dumps(document.get("warmup"), sort_keys=True)


def _compare_tree(a, b, path: str, rtol: float, atol: float) -> Divergence | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key == "line" and path.endswith("crash"):
                continue  # where in the file a crash was raised moves with any edit
            if key not in a or key not in b:
                return Divergence(f"{path}.{key}", "present on one side only")
            found = _compare_tree(a[key], b[key], f"{path}.{key}", rtol, atol)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and a and isinstance(a[0], (dict, list)):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _compare_tree(x, y, f"{path}[{i}]", rtol, atol)
            if found:
                return found
        if len(a) != len(b):
            return Divergence(path, f"A has {len(a)} entries, B has {len(b)}")
        return None
    difference = _numeric_difference(a, b, rtol, atol)
    return Divergence(path, difference) if difference else None
