"""The picture of a training run: mean loss per epoch, and probe accuracy before and after."""

from __future__ import annotations

from pathlib import Path

PROBES = ("linear", "knn")
PROBE_TITLES = {"linear": "linear probe", "knn": "kNN"}


def save_training_figure(metrics: dict, path: str | Path) -> Path:
    """Draw ``metrics["history"]`` and ``metrics["probe"]`` side by side into a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    history = metrics["history"]
    probe = metrics["probe"]
    figure, (loss_axes, probe_axes) = plt.subplots(1, 2, figsize=(10, 4))
    try:
        epochs = range(1, len(history) + 1)
        loss_axes.plot(epochs, history, marker="o")
        loss_axes.set_xlabel("epoch")
        loss_axes.set_ylabel("mean InfoNCE loss")
        loss_axes.set_title("training loss")
        loss_axes.grid(alpha=0.3)

        width = 0.38
        positions = range(len(PROBES))
        for offset, (stage, label) in zip(
            (-width / 2, width / 2), (("random_init", "random init"), ("trained", "trained"))
        ):
            values = [probe[stage][name] for name in PROBES]
            bars = probe_axes.bar([p + offset for p in positions], values, width, label=label)
            probe_axes.bar_label(bars, fmt="%.3f", fontsize=8)
        probe_axes.set_xticks(list(positions), [PROBE_TITLES[name] for name in PROBES])
        probe_axes.set_ylim(0, 1.2)
        probe_axes.set_ylabel("held-out accuracy")
        probe_axes.set_title("frozen features: random init vs trained")
        probe_axes.legend(loc="upper center", ncol=2)

        hyper = metrics.get("hyperparameters", {})
        figure.suptitle(
            f"MoCo on {metrics.get('data', {}).get('name', 'data')} - recipe "
            f"{metrics.get('recipe', '?')}, order {metrics.get('order', '?')}, "
            f"m={hyper.get('m')}, T={hyper.get('temperature')}, K={hyper.get('capacity')}"
        )
        figure.tight_layout()
        path = Path(path)
        figure.savefig(path, dpi=100)
    finally:
        plt.close(figure)
    return path
