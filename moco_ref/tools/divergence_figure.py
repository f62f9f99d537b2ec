"""Two recorded runs as a picture: per step, the largest relative difference of each
quantity (log scale), the float32 rounding band, and the first behaviour change marked."""

from __future__ import annotations

from pathlib import Path

import torch

from moco_ref.tools.refactor_guard import BUILDER_STEP_QUANTITIES, STEP_QUANTITIES, Verdict

FLOAT32_EPS = float(torch.finfo(torch.float32).eps)
PLOTTED = tuple(q for q in STEP_QUANTITIES if q != "ids")
BUILDER_PLOTTED = BUILDER_STEP_QUANTITIES
STYLES = {"q": ("-", "o"), "k": ("--", "s"), "grad": (":", "^"), "loss": ("-.", "v"),
          "query_params": ("-", "x"), "key_params": ("--", "+"), "logits": (":", "^"),
          "queue": (":", "d")}


def step_gaps(a: dict, b: dict) -> dict[str, list[float]]:
    """``{quantity: [largest relative difference at each step]}``."""
    plotted = BUILDER_PLOTTED if a.get("style") == "builder" else PLOTTED
    gaps: dict[str, list[float]] = {q: [] for q in plotted}
    for x, y in zip(a["steps"], b["steps"]):
        for quantity in plotted:
            if x.get(quantity) is None or y.get(quantity) is None:
                gaps[quantity].append(float("nan"))
                continue
            u = torch.tensor(x[quantity], dtype=torch.float64)
            v = torch.tensor(y[quantity], dtype=torch.float64)
            if u.shape != v.shape:
                gaps[quantity].append(float("nan"))
                continue
            scale = v.abs().max().clamp_min(1e-30)  # relative to the quantity's size
            gaps[quantity].append(float((u - v).abs().max() / scale) if u.numel() else 0.0)
    return gaps


def save_divergence_figure(a: dict, b: dict, verdict: Verdict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gaps = step_gaps(a, b)
    steps = list(range(len(a["steps"])))
    figure, axes = plt.subplots(figsize=(7.5, 4.0))
    for quantity, values in gaps.items():
        line, marker = STYLES.get(quantity, ("-", "."))
        shown = [max(v, 1e-18) for v in values]  # 0 (bitwise equal) at the bottom
        axes.semilogy(steps, shown, linestyle=line, marker=marker, color="black",
                      linewidth=1, markersize=4, label=quantity.replace("_", " "))
    axes.axhspan(1e-18, 10 * FLOAT32_EPS, color="0.85", label="float32 rounding (≤ 10 ε)")
    if verdict.kind == "behaviour" and verdict.where.startswith("step "):
        first = int(verdict.where.split()[1])
        axes.axvline(first, color="black", linestyle=(0, (1, 1)))
        axes.annotate(f" behaviour change: step {first}", (first, 1e-16), rotation=90,
                      fontsize=8, ha="right", va="bottom")
    axes.set_xlabel("training step")
    axes.set_ylabel("largest relative difference")
    axes.set_title({"identical": "identical", "rounding": "equivalent up to rounding",
                    "behaviour": "behaviour change"}[verdict.kind])
    axes.legend(fontsize=7, ncol=2, loc="upper left")
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
