"""The P17 walk as a picture: one MoCo step on a 4-slot dictionary.

Left, the diagram: one image, two views, the two encoders, q and k⁺ = k5, the comparison
and the loss, the dictionary k1…k4 with k5 entering and k1 leaving, and the two parameter
arrows (gradient → θq, EMA → θk). Right, the numbered event sequence as the trainer ran it
(``run_walk(order).events``); every diagram element carries its step number from that
sequence, so the EMA is drawn where it really happened in the chosen order.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from moco_ref.tools.walk import WALK_M, WALK_T, Walk

ORDER_TITLES = {"paper": "Algorithm 1 of the paper", "lab": "LAB 07 / official code"}
STAGE_PREFIXES = {  # diagram element -> how its event's stage name starts
    "views": "two views",
    "query": "query encoder",
    "key": "key encoder",
    "compare": "compare",
    "loss": "loss",
    "gradient": "gradient",
    "ema": "EMA",
    "fifo": "FIFO",
}
COLORS = {"query": "#1f77b4", "key": "#2ca02c", "loss": "#d62728", "ema": "#2ca02c",
          "gradient": "#d62728", "fifo": "#7f7f7f", "plain": "#444444"}


def step_numbers(walk: Walk) -> dict[str, int]:
    """``{element: 1-based position in walk.events}`` for each diagram element that ran."""
    numbers = {}
    for position, event in enumerate(walk.events, 1):
        for element, prefix in STAGE_PREFIXES.items():
            if element not in numbers and event.stage.startswith(prefix):
                numbers[element] = position
    return numbers


def figure_title(walk: Walk) -> str:
    return (
        f"MoCo, one step on a 4-slot dictionary (seed page P17) - order: {walk.order} "
        f"({ORDER_TITLES.get(walk.order, walk.order)})"
    )


def draw_walk(walk: Walk):
    """A matplotlib ``Figure`` of the walk (Agg backend; the caller saves or closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    numbers = step_numbers(walk)

    def tag(element: str) -> str:
        return f"[{numbers[element]}] " if element in numbers else ""

    figure, (diagram, timeline) = plt.subplots(
        1, 2, figsize=(16, 7.5), gridspec_kw={"width_ratios": [1.55, 1]}
    )
    figure.suptitle(figure_title(walk), fontsize=13, fontweight="bold")
    _draw_diagram(diagram, walk, tag)
    _draw_timeline(timeline, walk, numbers)
    figure.tight_layout(rect=(0, 0, 1, 0.95))
    return figure


def save_walk_figure(walk: Walk, path: str | Path) -> Path:
    """Draw the walk and write it to ``path`` (PNG unless the suffix says otherwise)."""
    from matplotlib import pyplot as plt

    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    figure = draw_walk(walk)
    try:
        figure.savefig(path, dpi=100)
    finally:
        plt.close(figure)
    return path


def _draw_diagram(axes, walk: Walk, tag) -> None:
    axes.set_xlim(0, 13)
    axes.set_ylim(0, 10)
    axes.axis("off")
    box = _boxer(axes)
    arrow = _arrower(axes)

    box(0.9, 5.6, "image 5", "plain")
    box(3.0, 7.6, f"{tag('views')}view a", "plain")
    box(3.0, 3.6, f"{tag('views')}view b", "plain")
    box(5.6, 7.6, f"{tag('query')}query encoder θq\n(autograd)", "query")
    box(5.6, 3.6, f"{tag('key')}key encoder θk\n(no grad)", "key")
    box(8.0, 7.6, "q", "query")
    box(8.0, 3.6, "k⁺ = k5", "key")
    comparison = f"{tag('compare')}q · [k⁺, k1…k4] / T"
    box(10.8, 5.6, f"{comparison}\n{tag('loss')}L = −ln p⁺ = {walk.loss:.4f}", "loss")
    for start, end in (((1.5, 5.9), (2.4, 7.4)), ((1.5, 5.3), (2.4, 3.8)), ((3.6, 7.6), (4.5, 7.6)),
                       ((3.6, 3.6), (4.5, 3.6)), ((6.7, 7.6), (7.6, 7.6)), ((6.7, 3.6), (7.4, 3.6)),
                       ((8.4, 7.4), (9.5, 6.1)), ((8.7, 3.8), (9.5, 5.1))):
        arrow(start, end, "plain")

    # parameter arrows: gradient from the loss to θq, EMA from θq to θk
    arrow((10.8, 6.3), (6.2, 8.35), "gradient", curve=0.35, width=2.2)
    axes.text(8.9, 9.3, f"{tag('gradient')}gradient → θq", color=COLORS["gradient"],
              ha="center", fontsize=11, fontweight="bold")
    arrow((5.6, 6.95), (5.6, 4.25), "ema", style="dashed", width=2.2)
    axes.text(5.75, 5.6, f"{tag('ema')}EMA → θk\nθk ← {WALK_M}·θk + {1 - WALK_M:.1f}·θq",
              color=COLORS["ema"], fontsize=10, fontweight="bold", va="center")

    # the dictionary (oldest first): k1 leaves on the left, k5 enters on the right
    slots_x = [5.0 + 1.25 * i for i in range(len(walk.dictionary_before))]
    axes.text(3.0, 1.45, f"{tag('compare')}old dictionary\n(oldest first)", ha="center",
              va="center", fontsize=10)
    for x, name in zip(slots_x, walk.dictionary_before):
        box(x, 1.45, name, "fifo", pad=0.35)
    arrow((slots_x[0] - 0.35, 1.0), (slots_x[0] - 1.6, 0.35), "fifo")
    axes.text(slots_x[0] - 1.7, 0.1, f"{tag('fifo')}k1 leaves", color=COLORS["fifo"],
              fontsize=10, ha="center")
    entering_x = slots_x[-1] + 1.25
    axes.text(entering_x, 1.45, "k5", ha="center", va="center", fontsize=10,
              color=COLORS["key"], bbox={"boxstyle": "round,pad=0.35", "facecolor": "white",
                                         "edgecolor": COLORS["key"], "linestyle": "dashed"})
    arrow((8.3, 3.25), (entering_x - 0.1, 1.85), "key")
    axes.text(entering_x + 0.4, 2.3, f"{tag('fifo')}k5 enters", color=COLORS["key"],
              fontsize=10)
    arrow((slots_x[-1] + 0.1, 1.85), (10.4, 4.95), "plain")  # old dictionary -> comparison
    axes.text(12.9, 0.35,
              f"next batch's dictionary: {' '.join(walk.dictionary_after)}\n"
              "(k2…k4 kept bit for bit, not recomputed)",
              ha="right", fontsize=10, style="italic")
    axes.text(0.1, 9.6, f"m = {WALK_M}, T = {WALK_T}; [n] = step n of the sequence on the right",
              fontsize=9, color="#555555")


def _draw_timeline(axes, walk: Walk, numbers: dict[str, int]) -> None:
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.axis("off")
    axes.set_title(f"what the trainer did, in order ({walk.order})", fontsize=11)
    highlighted = {numbers.get("ema"): "ema", numbers.get("gradient"): "gradient"}
    rows = len(walk.events)
    for position, event in enumerate(walk.events, 1):
        y = 1.0 - (position - 0.5) / rows
        element = highlighted.get(position)
        color = COLORS[element] if element else "#222222"
        detail = textwrap.fill(event.detail, width=58)
        axes.text(0.0, y, f"{position}. {event.stage}", color=color, fontsize=10,
                  fontweight="bold" if element else "normal", va="center")
        axes.text(0.36, y, detail, fontsize=7.5, color="#333333", va="center")


def _boxer(axes):
    def box(x: float, y: float, text: str, kind: str, pad: float = 0.45) -> None:
        axes.text(x, y, text, ha="center", va="center", fontsize=10,
                  bbox={"boxstyle": f"round,pad={pad}", "facecolor": "white",
                        "edgecolor": COLORS[kind], "linewidth": 1.6})
    return box


def _arrower(axes):
    def arrow(start, end, kind: str, *, curve: float = 0.0, style: str = "solid",
              width: float = 1.3) -> None:
        axes.annotate("", xy=end, xytext=start, arrowprops={
            "arrowstyle": "-|>", "color": COLORS[kind], "linewidth": width,
            "linestyle": style, "connectionstyle": f"arc3,rad={curve}",
        })
    return arrow
