"""The pictures of the feedback pages and the class report, in one style.

Every figure is drawn with matplotlib's Agg backend (no display, no network) and returned as
PNG bytes, to be inlined as a ``data:`` URI. The style reads in greyscale: the series differ
by line style and marker, not by colour alone. matplotlib is an optional dependency (the
``lab`` and ``test`` extras): it is imported lazily, ``available()`` says whether it is
there, and without it every figure function returns None (the pages say so).

A check's figure is driven by the machine-readable evidence in ``CheckResult.details``:

- ``loss_reference`` / ``loss_submission`` (+ ``steps``): the loss per step, submission
  against reference, the first differing step marked;
- ``queue_ids_expected`` / ``queue_ids_got``: the queue's ids at the step they part; without
  them, the arrival ranges said in ``expected``/``got`` (``arrivals 210–449 of 450``);
- ``ema_key`` / ``ema_predicted`` / ``ema_query``: θk against m·θk + (1 − m)·θq over steps;
- ``mask_rows`` / ``mask_expected`` / ``mask_rule`` / ``mask_negatives`` (lab) or
  ``mask_grid_expected`` / ``mask_grid_got`` (components): the masked logit columns.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable

INK, GREY, LIGHT = "#111111", "#777777", "#cccccc"
_STYLE = {
    "figure.figsize": (6.4, 3.2),
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e5e5e5",
    "grid.linewidth": 0.6,
    "axes.prop_cycle": None,  # set in _pyplot: black/grey, never colour alone
    "legend.frameon": False,
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
}
MAX_POINTS = 500  # no figure draws more series points than this


def available() -> bool:
    """Whether figures can be drawn (matplotlib is installed)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from cycler import cycler

    style = dict(_STYLE)
    style["axes.prop_cycle"] = cycler(color=[INK, GREY, INK]) + cycler(
        linestyle=["-", "--", ":"]) + cycler(marker=["o", "s", "^"])
    plt.rcParams.update(style)
    return plt


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(figure)
    return buffer.getvalue()


def _numbers(values) -> list[float | None]:
    out = []
    for value in list(values or [])[:MAX_POINTS]:
        try:
            out.append(None if value is None else float(value))
        except (TypeError, ValueError):
            out.append(None)
    return out


def _series(values: list[float | None]) -> tuple[list[int], list[float]]:
    points = [(t, v) for t, v in enumerate(values) if v is not None and v == v]
    return [t for t, _ in points], [v for _, v in points]


# --------------------------------------------------------------------------- per check


def loss_figure(details: dict) -> bytes | None:
    """The loss per step, the submission's against the reference's."""
    reference, submission = (_numbers(details.get("loss_reference")),
                             _numbers(details.get("loss_submission")))
    if not reference or not available():
        return None
    steps = [int(t) for t in details.get("steps", []) if isinstance(t, int)]
    first = min(steps) if steps else next(
        (t for t, (r, s) in enumerate(zip(reference, submission)) if s is None or r is None
         or abs(r - s) > 1e-6 * max(1.0, abs(r))), None)
    plt = _pyplot()
    figure, axes = plt.subplots()
    x, y = _series(reference)
    axes.plot(x, y, color=INK, linestyle="-", marker="o", label="reference loss")
    x, y = _series(submission)
    if x:
        axes.plot(x, y, color=GREY, linestyle="--", marker="s", label="your loss (recomputed)")
    missing = [t for t, v in enumerate(submission) if v is None]
    if missing:
        low = min(v for v in reference if v is not None)
        axes.plot(missing, [low] * len(missing), linestyle="none", marker="x", color=INK,
                  label="no known loss explains your gradient")
    if first is not None:
        axes.axvline(first, color=INK, linestyle=":", linewidth=1.2)
        axes.annotate(f"first differing step: {first}", xy=(first, 1.0),
                      xycoords=("data", "axes fraction"), xytext=(4, -12),
                      textcoords="offset points", fontsize=8)
    values = [v for v in reference + submission if v is not None]
    if values and min(values) > 0 and max(values) / min(values) > 20:
        axes.set_yscale("log")
    axes.set_xlabel("training step")
    axes.set_ylabel("loss")
    axes.set_title("Loss per step")
    axes.legend(loc="best", fontsize=8)
    return _png(figure)


_ARRIVALS = re.compile(r"arrivals (\d+)[–-](\d+)(?: of (\d+))?")


def queue_figure(details: dict) -> bytes | None:
    """The queue's ids expected against got at the step where they part (or, without ids, the
    ranges of arrivals each holds)."""
    if not available():
        return None
    expected_ids = _numbers(details.get("queue_ids_expected"))
    got_ids = _numbers(details.get("queue_ids_got"))
    plt = _pyplot()
    if expected_ids or got_ids:
        figure, axes = plt.subplots()
        x, y = _series(expected_ids)
        axes.plot(x, y, linestyle="none", marker="o", markerfacecolor="none", color=INK,
                  label="expected id")
        x, y = _series(got_ids)
        axes.plot(x, y, linestyle="none", marker="x", color=GREY, label="your id")
        part = next((i for i, (a, b) in enumerate(zip(expected_ids, got_ids)) if a != b), None)
        if part is not None:
            axes.axvline(part, color=INK, linestyle=":", linewidth=1.2)
            axes.annotate(f"first difference: slot {part}", xy=(part, 1.0),
                          xycoords=("data", "axes fraction"), xytext=(4, -12),
                          textcoords="offset points", fontsize=8)
        axes.set_xlabel("queue slot (oldest first)")
        axes.set_ylabel("source id")
        where = details.get("where") or ""
        axes.set_title("Queue ids, expected against yours" + (f" ({where})" if len(where) < 40
                                                                else ""))
        axes.legend(loc="best", fontsize=8)
        return _png(figure)
    want = _ARRIVALS.search(str(details.get("expected", "")))
    have = _ARRIVALS.search(str(details.get("got", "")))
    if not want or not have:
        plt.close("all")
        return None
    total = int(want.group(3) or have.group(3) or max(int(want.group(2)), int(have.group(2))) + 1)
    figure, axes = plt.subplots(figsize=(6.4, 2.0))
    axes.grid(False)
    for row, (match, hatch, face) in enumerate(((want, "", GREY), (have, "////", "white"))):
        first, last = int(match.group(1)), int(match.group(2))
        axes.barh(row, last - first + 1, left=first, height=0.6, color=face, edgecolor=INK,
                  hatch=hatch)
        axes.annotate(f"arrivals {first}–{last}", (first + (last - first) / 2, row),
                      ha="center", va="center", fontsize=8,
                      bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "none"})
    axes.set_yticks([0, 1], ["expected", "yours"])
    axes.set_xlim(0, total)
    axes.invert_yaxis()
    axes.set_xlabel(f"key arrival (0 = first key enqueued; {total} in all)")
    axes.set_title("Which keys the queue holds")
    return _png(figure)


def ema_figure(details: dict) -> bytes | None:
    """θk at one parameter over the key forwards against the EMA's prediction."""
    key = _numbers(details.get("ema_key"))
    if len(key) < 2 or not available():
        return None
    predicted, query = _numbers(details.get("ema_predicted")), _numbers(details.get("ema_query"))
    m = details.get("ema_m")
    plt = _pyplot()
    figure, axes = plt.subplots()
    x, y = _series(query)
    if x:
        axes.plot(x, y, color=LIGHT, linestyle=":", marker="^", label="θq (query encoder)")
    x, y = _series(predicted)
    label = "m·θk + (1 − m)·θq" + (f", m = {float(m):.4g}" if m is not None else "")
    axes.plot(x, y, color=GREY, linestyle="--", marker="s", markerfacecolor="none", label=label)
    x, y = _series(key)
    axes.plot(x, y, color=INK, linestyle="-", marker="o", markersize=3, label="θk (yours)")
    axes.set_xlabel("key forward (training step)")
    axes.set_ylabel(f"parameter {details.get('ema_parameter', '')}".strip())
    axes.set_title("The key encoder against the EMA law")
    axes.legend(loc="best", fontsize=8)
    return _png(figure)


def _mask_grids(details: dict) -> tuple[list[list[int]], list[list[int]], list[str]] | None:
    if "mask_grid_expected" in details:
        want = [[int(bool(v)) for v in row][:MAX_POINTS] for row in
                details["mask_grid_expected"]][:32]
        have = [[int(bool(v)) for v in row][:MAX_POINTS] for row in
                details.get("mask_grid_got", [])][:32]
        return want, have, [f"query {i}" for i in range(len(want))]
    rows, columns = details.get("mask_rows"), details.get("mask_expected")
    n = int(details.get("mask_negatives") or 0)
    if not rows or columns is None or n <= 0:
        return None
    n = min(n, MAX_POINTS)
    rule = details.get("mask_rule", "none")
    want = [[int(j in set(cols)) for j in range(n)] for cols in columns]
    if rule == "inverted":
        have = [[1 - v for v in row] for row in want]
    else:  # "none", "fill-zero" (set to 0, still in the softmax): nothing masked
        have = [[0] * n for _ in want]
    return want, have, [f"query {i}" for i in rows]


def mask_figure(details: dict) -> bytes | None:
    """The negative columns masked (should be, and were) for a few queries."""
    grids = _mask_grids(details)
    if grids is None or not grids[0] or not available():
        return None
    want, have, labels = grids
    width = max(len(row) for row in want)
    plt = _pyplot()
    height = 0.8 + 0.28 * len(want)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 2 * height), sharex=True)
    for axes, grid, title in ((top, want, "masked (−∞) as the reference does"),
                              (bottom, have, "masked in your logits")):
        padded = [row + [0] * (width - len(row)) for row in (grid or [[0] * width] * len(want))]
        axes.imshow(padded, cmap="Greys", vmin=0, vmax=1, aspect="auto",
                    interpolation="nearest")
        if not any(any(row) for row in padded):
            axes.text(0.5, 0.5, "nothing masked", transform=axes.transAxes, ha="center",
                      va="center", fontsize=9, color=GREY)
        axes.set_yticks(range(len(labels)), labels, fontsize=7)
        axes.grid(False)
        axes.set_title(title, fontsize=9)
    step = details.get("mask_step")
    bottom.set_xlabel("negative column (queue slot)")
    figure.suptitle("Same-source mask" + (f" at step {step}" if step is not None else ""))
    return _png(figure)


FIGURES: tuple[tuple[str, Callable[[dict], bytes | None], str], ...] = (
    ("loss_reference", loss_figure, "Loss per step: yours (recomputed from your gradients) "
     "against the reference; the dotted line marks the first step that differs."),
    ("queue_ids_expected", queue_figure, "The queue's ids, expected against yours."),
    ("ema_key", ema_figure, "One key-encoder parameter over the run (the one furthest off "
     "the EMA law) against what θk ← m·θk + (1 − m)·θq predicts from the step before."),
    ("mask_rows", mask_figure, "The logit columns of your queries' own-image negatives: "
     "dark cells must be masked (probability 0)."),
    ("mask_grid_expected", mask_figure, "The masked negative columns: the reference's against "
     "yours."),
)


def check_figures(details: dict) -> list[tuple[str, bytes]]:
    """``[(caption, PNG)]`` for one check's details (empty without matplotlib or evidence)."""
    out = []
    for key, draw, caption in FIGURES:
        if key in details:
            png = draw(details)
            if png:
                out.append((caption, png))
    if not out and _ARRIVALS.search(str(details.get("expected", ""))):
        png = queue_figure(details)
        if png:
            out.append(("Which keys the queue holds: the ones it should (the newest) against "
                        "yours, by order of arrival.", png))
    return out


def wants_figure(details: dict) -> bool:
    """Whether these details hold evidence a figure shows."""
    return any(key in details for key, _, _ in FIGURES) or bool(
        _ARRIVALS.search(str(details.get("expected", ""))))


# --------------------------------------------------------------------------- class report


def score_histogram(percents: list[float], bins: list[tuple[float, float]]) -> bytes | None:
    """How many submissions scored in each bin (percent of the maximum)."""
    if not available():
        return None
    counts = [sum(1 for p in percents if _in_bin(p, low, high, last=i == len(bins) - 1))
              for i, (low, high) in enumerate(bins)]
    plt = _pyplot()
    figure, axes = plt.subplots()
    positions = list(range(len(bins)))
    axes.bar(positions, counts, color="white", edgecolor=INK, hatch="//")
    for x, count in zip(positions, counts):
        if count:
            axes.annotate(str(count), (x, count), ha="center", va="bottom", fontsize=8)
    axes.set_xticks(positions, [f"{low:g}–{high:g}" for low, high in bins], rotation=30)
    axes.set_xlabel("score (% of the maximum)")
    axes.set_ylabel("submissions")
    axes.set_title("Scores")
    axes.yaxis.get_major_locator().set_params(integer=True)
    return _png(figure)


def _in_bin(value: float, low: float, high: float, *, last: bool) -> bool:
    return low <= value < high or (last and value == high)


def family_figure(broken: dict[str, int], total: int) -> bytes | None:
    """How many students broke each invariant family."""
    if not available() or not broken:
        return None
    names = list(broken)
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.4, 0.6 + 0.3 * len(names)))
    axes.barh(names, [broken[n] for n in names], color=GREY, edgecolor=INK)
    axes.invert_yaxis()
    axes.set_xlim(0, max(1, total))
    axes.set_xlabel(f"students who broke it (of {total})")
    axes.set_title("Invariant families broken")
    axes.xaxis.get_major_locator().set_params(integer=True)
    return _png(figure)
