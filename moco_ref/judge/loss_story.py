"""A loss diagnosis as data, and its text: which steps computed which loss, each departure
from the reference named with the check whose conclusion it is (``owner_of``).

The judge stores a story beside a message that tells it (``details["loss_story"]``), so a
student view can tell the same story without the departures of a check the student is not
shown yet (``story_text(..., withheld=…)``): those steps read as the reference loss, exactly as
a submission without that fault reads. Plain data and no torch: the reports read it.
"""

from __future__ import annotations

REFERENCE_TEXT = "the reference loss"
UNEXPLAINED_TEXT = "no known form"

# The check that judges each choice of the loss: the conclusion a step's form carries is that
# check's (a form's text shown to a student is shown only with its check). Every other choice
# is I8-loss-matches-recomputation's.
FACTOR_OWNERS: dict[str, str] = {
    "temperature": "I8-temperature-divides-logits",
    "warmup_temperature": "I8-temperature-divides-logits",
    "queue_t": "I8-temperature-divides-logits",
    "warmup_t": "I8-temperature-divides-logits",
    "positive_t": "I8-temperature-divides-logits",
    "normalize": "I8-embeddings-normalized",
    "mask": "I4-same-source-masked",
    "empty_queue": "I8-empty-queue-in-batch",
    "branch": "I8-empty-queue-in-batch",
}
VALUE_OWNERS: dict[tuple[str, object], str] = {
    ("mask", "positive-too"): "I4-positive-never-masked",
    ("mask", "ids-bfloat16"): "I3-ids-move-with-keys",
    ("negatives", "after"): "I9-batch-not-own-negative",
    ("negatives", "with-current"): "I9-batch-not-own-negative",
    ("negatives", "recomputed"): "I2-negatives-not-recomputed",
}
LOSS_CHECK_ID = "I8-loss-matches-recomputation"


def owner_of(factor: str, value) -> str:
    """The check whose conclusion a loss form's ``factor = value`` is."""
    return VALUE_OWNERS.get((factor, value)) or FACTOR_OWNERS.get(factor) or LOSS_CHECK_ID


def story_run(first: int, last: int, parts, context: str = "", explained: bool = True) -> dict:
    """One run of consecutive steps explained alike: ``parts`` are ``(owner, text)``."""
    return {"first": first, "last": last, "context": context, "explained": explained,
            "parts": [[owner, text] for owner, text in parts]}


def owners(story: dict) -> set[str]:
    """Every check whose conclusion the story carries."""
    return {owner for run in story.get("runs", []) for owner, _ in run.get("parts", [])}


def _merged(story: dict, withheld) -> list[dict]:
    merged: list[dict] = []
    for run in story.get("runs", []):
        if run.get("explained", True):
            what = "; ".join(text for owner, text in run.get("parts", [])
                             if owner not in withheld) or REFERENCE_TEXT
        else:
            what = UNEXPLAINED_TEXT
        if merged and merged[-1]["what"] == what and merged[-1]["last"] == run["first"] - 1:
            merged[-1]["last"] = run["last"]
        else:
            merged.append({"first": run["first"], "last": run["last"],
                           "context": run.get("context", ""), "what": what})
    return merged


def story_text(story: dict, limit: int = 4, withheld=frozenset()) -> str:
    """``steps 0–3: the reference loss; steps 4–11 (the queue holding 240 keys): no
    same-source mask``, without the departures of the ``withheld`` checks."""
    runs = _merged(story, withheld)
    parts = []
    for run in runs[:limit]:
        first, last = run["first"], run["last"]
        span = f"step {first}" if first == last else f"steps {first}–{last}"
        if run["context"] and first > 0:
            span += f" ({run['context']})"
        parts.append(f"{span}: {run['what']}")
    if len(runs) > limit:
        parts.append(f"… {len(runs) - limit} more runs")
    return "; ".join(parts)


def story_verdict(story: dict, withheld=frozenset()) -> str:
    """The loss check's message on a pass: ``matches <form>`` when one form explains every
    step, else the steps told run by run."""
    runs = _merged(story, withheld)
    if len(runs) == 1:
        return f"matches {runs[0]['what']}"
    return "explained step by step: " + story_text(story, withheld=withheld)
