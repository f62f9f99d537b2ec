"""One submission's wall time against the bare import of torch and torchvision, measured in
the same run with interleaved rounds (issue 19's target: ≤ 1.25×; the median ratio is in the
benchmark's extra_info)."""

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORRECT = ROOT / "examples" / "submissions" / "correct_lab_order.py"
ROUNDS = 4


def _seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=dict(os.environ))
    return time.perf_counter() - started


def test_one_submission_against_the_bare_import(benchmark):
    benchmark.group = "latency: one submission / import torch+torchvision"
    grade = [sys.executable, "-m", "moco_ref.cli", "grade", str(CORRECT), "--brief"]
    bare = [sys.executable, "-c", "import torch, torchvision"]
    torch_only = [sys.executable, "-c", "import torch"]
    runs: dict[str, list[float]] = {"import": [], "grade": [], "torch": []}

    def one_round():
        runs["import"].append(_seconds(bare))
        runs["grade"].append(_seconds(grade))
        runs["torch"].append(_seconds(torch_only))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    ratios = [g / i for g, i in zip(runs["grade"], runs["import"], strict=True)]
    benchmark.extra_info["ratio_median"] = round(statistics.median(ratios), 3)
    benchmark.extra_info["import_seconds_median"] = round(statistics.median(runs["import"]), 3)
    # the stricter reference: torch alone (torchvision's import pulls in torch's compiler)
    benchmark.extra_info["ratio_to_torch_alone_median"] = round(statistics.median(
        [g / t for g, t in zip(runs["grade"], runs["torch"], strict=True)]), 3)
    print(dict(benchmark.extra_info))
    assert all(t > 0 for t in runs["grade"])
