"""The goldens hold under what another machine brings (issue 27.5): another thread count and
another ATen CPU capability (the vectorised kernels torch picks for the CPU at start-up).

Each case is a fresh interpreter that pins the thread count (``OMP_NUM_THREADS`` and
``torch.set_num_threads``) and the capability (``ATEN_CPU_CAPABILITY``), proves that both are in
force, and runs ``moco-ref golden check``. The 1-ulp/2-ulp perturbations are in test_golden.py;
this file is kept out of mutmut's selection (a subprocess per mutant would only slow it).

One representative runs by default: 1 thread on the plain (non-vectorised) kernels, the
furthest from a 2-core AVX2/AVX-512 run that wrote the goldens. The full grid is ``slow``."""

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["DEFAULT", "AVX2", "AVX512"]  # ATen's capabilities on x86, each a superset of the last

CASE = """
import json, sys
import torch
threads = int(sys.argv[1])
torch.set_num_threads(threads)
print(json.dumps({"threads": torch.get_num_threads(),
                  "capability": torch.backends.cpu.get_cpu_capability()}), flush=True)
from moco_ref.cli import main
sys.exit(main(["golden", "check"]))
"""


def _environment(threads: int, capability: str | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability.lower()
    return env


@cache
def _machine_capability() -> str:
    """The best capability this CPU offers (what torch picks when not told)."""
    if "ATEN_CPU_CAPABILITY" not in os.environ:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run([sys.executable, "-c", probe], env=_environment(1, None), cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()


def _golden_check(threads: int, capability: str) -> None:
    best = _machine_capability()
    if ORDER.index(capability) > ORDER.index(best if best in ORDER else "DEFAULT"):
        pytest.skip(f"this CPU offers {best}, not {capability}")
    done = subprocess.run([sys.executable, "-c", CASE, str(threads)], cwd=ROOT,
                          env=_environment(threads, capability), capture_output=True, text=True,
                          timeout=600)
    first, _, report = done.stdout.partition("\n")
    in_force = json.loads(first) if first.startswith("{") else {}
    assert in_force == {"threads": threads, "capability": capability}, (
        f"asked for {threads} threads on {capability}, got {first!r}\n{done.stderr[-2000:]}")
    assert done.returncode == 0, f"golden check failed:\n{report}{done.stderr[-2000:]}"
    assert report.rstrip().endswith("all hold"), report


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_goldens_hold_on_one_thread_and_the_plain_kernels():
    _golden_check(1, "DEFAULT")


@pytest.mark.slow
@pytest.mark.parametrize("capability", ORDER)
@pytest.mark.parametrize("threads", [1, 2])
def test_goldens_hold_for_every_thread_count_and_cpu_capability(threads, capability):
    _golden_check(threads, capability)
