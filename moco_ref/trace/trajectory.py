"""A recording as a refactor-guard trajectory (``moco_ref.tools.refactor_guard``): the same
step-by-step quantities as a module recorded on the grader's probe, plus a digest of the
images each step was fed and where the user's run crashed, so two recordings of the same
script at two revisions compare with ``moco-ref compare``."""

from __future__ import annotations

import traceback

from moco_ref.judge.judge import judge_evidence
from moco_ref.judge.trace_evidence import TraceEvidence
from moco_ref.probe.options import GradeOptions
from moco_ref.tools import refactor_guard
from moco_ref.trace.recorder import Recording
from moco_ref.trace.tracks import track_records


def trajectory_of(recording: Recording | None, source: str, *,
                  error: BaseException | None = None, notes: list[str] | None = None) -> dict:
    """The trajectory of the recording's first dictionary track (a per-view code: queue 0's);
    ``error``: what the user's run raised, told in its own terms."""
    head = {**refactor_guard.trajectory_head("builder", source),
            "recorded": "in the user's own process (moco_ref.trace)", "notes": notes or []}
    if recording is None or not recording.steps:
        crash = _crash(error, 0) if error else {
            "where": "your run", "stage": "step 0", "frame": "", "line": None,
            "exception": "no training step was recorded (the attached class was never "
                         "called, or no optimizer.step() followed its forward)"}
        return {**head, "steps": [], "final": None, "laws": None, "start": None, "runs": {},
                "warmup": None, "crash": crash}
    parts = recording.parts
    options = GradeOptions(style="builder", temperature=parts.temperature or 0.2,
                           expect_m=parts.momentum)
    _, record = track_records(recording)[0]
    evidence = TraceEvidence(record, options, temperature=parts.temperature,
                             momentum=parts.momentum, from_start=parts.from_start)
    judged = judge_evidence(evidence, "builder", options)
    body = refactor_guard.builder_trajectory(record, evidence=evidence, judged=judged)
    if error is not None:
        body["crash"] = _crash(error, len(recording.steps))
    return {**head, **body}


def _crash(error: BaseException, steps: int) -> dict:
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if "/moco_ref/" not in f.filename.replace("\\", "/")]
    last = own[-1] if own else (frames[-1] if frames else None)
    text = " ".join(f"{type(error).__name__}: {error}".split())[:300]
    return {"where": "your run", "stage": f"step {steps}", "exception": text,
            "frame": f"in {last.name} ({last.filename.rsplit('/', 1)[-1]})" if last else "",
            "line": last.lineno if last else None}
