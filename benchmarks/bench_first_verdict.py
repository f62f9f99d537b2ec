"""Time to the first verdict a newcomer sees (issue 39): the default ``moco-ref demo`` (a
dozen examples, the README's first command) and ``moco-ref grade`` of one file, each against
``python -c "import torch"`` measured in the same run with interleaved rounds; the medians and
ratios are in the benchmark's extra_info (``tox -e bench`` keeps them)."""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORRECT = ROOT / "examples" / "submissions" / "correct_lab_order.py"
ROUNDS = 2


def _seconds(command: list[str], cwd: str) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=dict(os.environ), cwd=cwd)
    return time.perf_counter() - started


def test_time_to_first_verdict(benchmark):
    benchmark.group = "first minutes: demo and one grade / import torch"
    commands = {
        "demo": [sys.executable, "-m", "moco_ref.cli", "demo"],
        "grade": [sys.executable, "-m", "moco_ref.cli", "grade", str(CORRECT), "--brief"],
        "torch": [sys.executable, "-c", "import torch"],
    }
    runs: dict[str, list[float]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as folder:  # the demo writes its scoreboard here

        def one_round():
            for name, command in commands.items():
                runs[name].append(_seconds(command, folder))

        benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    for name in commands:
        benchmark.extra_info[f"{name}_seconds_median"] = round(statistics.median(runs[name]), 2)
    for name in ("demo", "grade"):
        benchmark.extra_info[f"{name}_to_torch_ratio_median"] = round(statistics.median(
            [a / t for a, t in zip(runs[name], runs["torch"], strict=True)]), 2)
    print(dict(benchmark.extra_info))
    assert all(t > 0 for values in runs.values() for t in values)
