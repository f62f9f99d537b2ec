"""From a ``Recording`` to builder records, one per dictionary *track*.

Which view each encoder forward ran on, and which image each row is, is read from the inputs
themselves: two forwards whose input rows are the same bytes ran on the same images, in the
order the rows give (a key encoder fed a shuffled batch is put back in the images' order).
The first view the query encoder sees is ``im_q``; the first other one the key encoder sees is
``im_k``. A code that keeps one queue per view (``layout="per-view"``: ``[V, dim, K]``) gives
one track per queue: queue ``v`` holds the keys of view ``v`` and is the negatives of the
queries of the other view, whose positive is view ``v``'s key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from moco_ref.probe.builder import KEY_VIEW, QUERY_VIEW

if TYPE_CHECKING:  # the recorder judges through this module: its types are for reading only
    from moco_ref.trace.recorder import Recording, State, Step

OTHER_VIEW = 2  # rows of images neither view holds (a monitor's forward, another crop)


def track_records(recording: Recording) -> list[tuple[str, dict]]:
    """``[(track name, builder record)]``: one track, or one per view's queue."""
    steps = [_traced(step) for step in recording.steps]
    if recording.parts.layout != "per-view":
        return [("", _record(recording, steps, None))]
    return [(f"queue {v} (keys of view {v}, negatives of view {1 - v}'s queries)",
             _record(recording, steps, v)) for v in (0, 1)]


def _traced(step: Step) -> list[dict]:
    """Each forward with the view and image of each of its rows."""
    views: list[dict[bytes, int]] = [  # view -> row digest -> image index
        {d: r for r, d in enumerate(rows)} for rows in step.views]
    queries = [i for i, f in enumerate(step.forwards) if f.role == "q"]
    keys = [i for i, f in enumerate(step.forwards) if f.role != "q"]
    if not queries and not views:
        views.append({})  # the query encoder never ran: im_q is still view 0
    assigned: dict[int, tuple[list[int], list[int]]] = {}
    for i in queries + keys:
        digests = step.forwards[i].rows
        view = next((v for v, rows in enumerate(views)
                     if digests and all(d in rows for d in digests)), None)
        if view is None:
            views.append({d: r for r, d in enumerate(digests)})
            view = len(views) - 1
        assigned[i] = ([view] * len(digests), [views[view][d] for d in digests])
    events = []
    for i, forward in enumerate(step.forwards):
        view_list, rows = assigned[i]
        events.append({
            "forward": forward,
            "views": torch.tensor([v if v in (QUERY_VIEW, KEY_VIEW) else OTHER_VIEW
                                   for v in view_list], dtype=torch.int64),
            "rows": torch.tensor(rows, dtype=torch.int64),
        })
    return events


def _state(state: State | None, view: int | None, with_queue: bool = True) -> dict | None:
    if state is None:
        return None
    found = {"params_q": state.params_q, "params_k": state.params_k}
    if with_queue:
        queue = state.queue
        if queue is not None and view is not None:
            queue = queue[view] if queue.ndim == 3 and len(queue) > view else None
        found["queue"] = None if queue is None else queue.to(torch.float64)
        found["queue_ptr"] = state.pointer
    return found


def _record(recording: Recording, traced: list[list[dict]], view: int | None) -> dict:
    """A builder record of one track (``view``: the per-view queue it follows)."""
    parts = recording.parts
    names_q = [name for name, _ in recording.layout_q]
    shapes_q = [tuple(p.shape) for _, p in recording.layout_q]
    shapes_k = [tuple(p.shape) for _, p in recording.layout_k]
    names_k = names_q if shapes_q == shapes_k else [name for name, _ in recording.layout_k]
    layout = "rows" if parts.layout == "rows" else "dim-first"
    module = {
        "class": type(parts.modules("q")[0]).__name__,
        "layout_q": [{"name": n, "shape": list(s), "numel": _numel(s)}
                     for n, s in zip(names_q, shapes_q)],
        "layout_k": [{"name": n, "shape": list(s), "numel": _numel(s)}
                     for n, s in zip(names_k, shapes_k)],
        "requires_grad_q": [bool(p.requires_grad) for _, p in recording.layout_q],
        "requires_grad_k": [bool(p.requires_grad) for _, p in recording.layout_k],
        "encoder_q": True, "encoder_k": True,
        "attributes": {"T": parts.temperature, "m": parts.momentum},
        "buffers": [], "factory_calls": [],
    }
    steps = []
    for step, events in zip(recording.steps, traced):
        record_events = []
        for event in events:
            forward, views = event["forward"], event["views"]
            if view is not None:  # this track's query is the other view's, its key this view's
                wanted = 1 - view if forward.role == "q" else view
                if not bool((views == wanted).all()):
                    continue
                views = torch.full_like(views, QUERY_VIEW if forward.role == "q" else KEY_VIEW)
            record_events.append({
                "role": forward.role, "grad_enabled": forward.grad_enabled,
                "has_grad_fn": forward.has_grad_fn, "training": forward.training,
                "probe_encoder": False, "output": forward.output, "views": views,
                "rows": event["rows"], "params_q": forward.params_q,
                "params_k": forward.params_k})
        record = {"before": _state(step.before, view), "events": record_events,
                  "inputs": _inputs_digest(step),
                  "after_forward": _state(step.after_forward, view),
                  "key_grads": step.key_grads, "loss_returned": False,
                  "after_step": _state(step.after_step, view, with_queue=False)}
        pairs = _pairs_of(step, recording, view, record_events)
        if len(pairs) == 2 and view is None:
            record["pairs"] = [{"logits": lg, "labels": lb} for lg, lb in pairs]
            record["logits"] = torch.cat([lg for lg, _ in pairs])
            record["labels"] = torch.cat([lb for _, lb in pairs])
        elif pairs:
            record["logits"], record["labels"] = pairs[0]
        if pairs:
            record["loss"] = float(sum(torch.nn.functional.cross_entropy(
                lg, lb.to(torch.int64)) for lg, lb in pairs))
        steps.append(record)
    initial = _state(recording.initial, view)
    queue = initial.get("queue") if initial else None
    dim = _dim(traced)
    K = 0 if queue is None else (queue.shape[-1] if layout == "dim-first" else queue.shape[0])
    batch = _batch(traced)
    if layout == "rows" and queue is not None:  # the evidence reads [K, dim] as "rows"
        pass
    probe = {"dim": dim, "K": int(K), "batch": batch, "steps": len(steps),
             "m": parts.momentum if parts.momentum is not None else 0.999,
             "T": parts.temperature if parts.temperature is not None else 1.0,
             "mlp_steps": 0, "ragged_steps": 0, "ranks_steps": 0}
    return {"probe": probe, "defined": True, "error": None,
            "environment": {"process_group": "none (recorded in the user's process)"},
            "run": {"mlp": False, "error": None, "stage": "done", "steps": steps,
                    "module": module, "initial": initial}}


def _pairs_of(step: Step, recording: Recording, view: int | None,
              events: list[dict]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The step's cross-entropy inputs that are MoCo logits: ``[n, 1 + K]`` against the
    dictionary; for a per-view track, the one whose negatives are its queries against its
    queue (else the one computed for it in order: the first half is view 0's queries)."""
    queue = step.before.queue
    pairs = step.pairs
    if queue is not None:
        K = queue.shape[-1] if recording.parts.layout != "rows" else queue.shape[0]
        matching = [(lg, lb) for lg, lb in pairs if lg.shape[1] == 1 + K]
        pairs = matching or pairs
    if view is None or len(pairs) < 2:
        return pairs[:2]
    q = next((e["output"] for e in events if e["role"] == "q"), None)
    if q is None or queue is None or queue.ndim != 3:
        return [pairs[min(1 - view, len(pairs) - 1)]]
    qn = torch.nn.functional.normalize(q.to(torch.float64), dim=1)
    expected = qn @ torch.nn.functional.normalize(queue[view].to(torch.float64), dim=0)

    def error(logits: torch.Tensor) -> float:
        got = logits[:, 1:]
        if got.shape != expected.shape:
            return float("inf")
        scale = float((got * expected).sum() / (expected * expected).sum().clamp_min(1e-30))
        return float((got - scale * expected).abs().max())

    return [min(pairs[:2], key=lambda pair: error(pair[0]))]


def _inputs_digest(step: Step) -> str:
    """One digest of every image the step's encoders (and ``MoCoParts.views``) were fed, in
    order: two recordings fed the same data have the same digests."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    for rows in step.views:
        digest.update(b"".join(rows))
    for forward in step.forwards:
        digest.update(forward.role.encode() + b"".join(forward.rows))
    return digest.hexdigest()


def _dim(traced: list[list[dict]]) -> int:
    for events in traced:
        for event in events:
            output = event["forward"].output
            if output is not None and output.ndim == 2:
                return int(output.shape[1])
    return 0


def _batch(traced: list[list[dict]]) -> int:
    for events in traced:
        for event in events:
            if event["forward"].role == "q":
                return len(event["forward"].rows)
    return 0


def _numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
