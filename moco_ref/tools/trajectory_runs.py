"""A module's other runs in a recording, and where a run crashed, in the user's terms.

Beside the main run the grader makes an ``mlp=True`` run, one with K not a multiple of the
batch and a two-process run; a recording keeps each briefly (per step the logits, the loss and
the buffer after the forward) so that the refactor guard compares them too, and a crash is told
as the run, the stage, the exception and the user's own frame (never a line number: a refactor
moves lines).
"""

from __future__ import annotations

import re

import torch


def plain(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().to(torch.float64).tolist() if value.is_floating_point() \
            else value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def start_of(run) -> dict | None:
    """The state a run starts from: θq, θk and the dictionary as built."""
    initial = run.get("initial") if isinstance(run, dict) else None
    if not isinstance(initial, dict):
        return None
    return {name: plain(initial.get(name)) for name in ("params_q", "params_k", "queue",
                                                         "queue_ptr")}


RUN_NAMES = {"mlp": "the mlp=True run", "ragged": "the run with K not a multiple of the batch"}


def other_runs(record: dict) -> dict:
    """Each other run the grader made, briefly: per step the logits, the loss and the buffer
    after the forward; or where it crashed."""
    runs = {name: record.get(name) for name in RUN_NAMES}
    ranks = record.get("ranks") if isinstance(record.get("ranks"), dict) else {}
    for rank, run in enumerate(ranks.get("runs") or []):
        runs[f"rank {rank}"] = run
    out = {}
    for name, run in runs.items():
        if not isinstance(run, dict):
            continue
        where = RUN_NAMES.get(name, f"the two-process run's {name}")
        out[name] = {"where": where, "crash": crash_of(run, where) if run.get("error")
                     else None,
                     "steps": [{"logits": plain(step.get("logits")), "loss": step.get("loss"),
                                "queue": plain((step.get("after_forward") or {}).get("queue"))}
                               for step in run.get("steps") or []]}
    return out


def crash_of(run, where: str, crash: BaseException | None = None) -> dict:
    """Where a run raised, in the user's terms: the run, the stage (construction or step t),
    the exception's last line and the user's own frame that raised it."""
    run = run if isinstance(run, dict) else {}
    text = str(run.get("error") or crash or "")
    text = text.split("\ntensors in ", 1)[0]
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    exception = lines[-1].strip() if lines else "an error"
    frames = [_FRAME.match(line.strip()) for line in lines]
    code = next((lines[i + 1].strip() for i in range(len(lines) - 1, -1, -1)
                 if frames[i] and i + 1 < len(lines) and not _FRAME.match(
                     lines[i + 1].strip())), "")
    frames = [match for match in frames if match]
    frame = f"in {frames[-1]['function']} ({frames[-1]['file'].rsplit('/', 1)[-1]})" \
        if frames else ""
    return {"where": where, "stage": str(run.get("stage") or ""), "exception": exception[:300],
            "frame": frame[:300], "code": code[:200] if code != exception else "",
            "line": int(frames[-1]["line"]) if frames else None}


# a traceback's frame line; the line number is kept apart (``line``): a refactor moves lines
_FRAME = re.compile(r'^File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<function>\S+)')


def crash_text(crash: dict) -> str:
    stage = crash.get("stage") or ""
    at = {"construct": "building the module", "optimizer": "building the optimizer"}.get(
        stage, stage)
    frame = f" ({crash['frame']}" + (f": {crash['code']}" if crash.get("code") else "") + ")" \
        if crash.get("frame") else ""
    return f"{crash['where']} raised at {at}: {crash['exception']}{frame}"
