"""Turn the newest pytest-benchmark JSON into benchmarks/RESULTS.md (a table of ratios inside
each group, with the machine) and benchmarks/results.png."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASELINES = ("KeyQueue", "official_style", "unmasked", "jobs1")  # the denominator of a group


def newest_run(root: Path) -> Path:
    runs = sorted(root.glob(".benchmarks/**/*.json"), key=lambda p: p.stat().st_mtime)
    if not runs:
        sys.exit("no benchmark JSON under .benchmarks/; run `tox -e bench` first")
    return runs[-1]


def _baseline(rows: list[dict]) -> dict:
    for row in rows:
        if any(marker in row["name"].replace("-", "").replace("[", " ").replace("]", " ")
               .replace(" ", "") for marker in BASELINES):
            return row
    return min(rows, key=lambda r: r["stats"]["median"])


def summarize(run: Path) -> str:
    data = json.loads(run.read_text())
    machine = data["machine_info"]
    groups: dict[str, list[dict]] = {}
    for bench in data["benchmarks"]:
        groups.setdefault(bench["group"] or bench["name"], []).append(bench)
    lines = ["# Benchmark results", "",
             f"Machine: {machine.get('node')}, {machine.get('cpu', {}).get('brand_raw', '?')}, "
             f"{machine.get('cpu', {}).get('count', '?')} cores, Python "
             f"{machine.get('python_version')}; run {data['datetime']} ({run.name}).", "",
             "Every ratio is against the first-named baseline of its group, measured in the same "
             "run (median times).", ""]
    for group, rows in groups.items():
        base = _baseline(rows)
        lines += [f"## {group}", "", "| benchmark | median | ratio | extra |", "|---|---|---|---|"]
        for row in sorted(rows, key=lambda r: r["name"]):
            median = row["stats"]["median"]
            extra = row.get("extra_info") or {}
            if "examples" in extra:
                extra = {"examples/s": round(extra["examples"] / row["stats"]["mean"], 1)}
            lines.append(f"| {row['name']} | {_seconds(median)} | "
                         f"{median / base['stats']['median']:.2f} | {extra or ''} |")
        lines.append("")
    return "\n".join(lines)


def _seconds(value: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e9:.3g} ns"


def plot(run: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(run.read_text())
    queue = [b for b in data["benchmarks"] if b["name"].startswith("test_enqueue")]
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in ("KeyQueue", "concat"):
        points = sorted((int(b["params"]["capacity"]), b["stats"]["median"] * 1e6)
                        for b in queue if b["params"]["kind"] == kind)
        if points:
            ax.plot(*zip(*points), marker="o", label=kind)
    ax.set(xscale="log", yscale="log", xlabel="queue capacity (keys of dim 128)",
           ylabel="enqueue of 256 keys, median µs", title="Enqueue cost against capacity")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> int:
    run = newest_run(HERE.parent)
    (HERE / "RESULTS.md").write_text(summarize(run) + "\n")
    plot(run, HERE / "results.png")
    print(f"wrote {HERE / 'RESULTS.md'} and {HERE / 'results.png'} from {run}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
