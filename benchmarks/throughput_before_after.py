"""The throughput of batch grading, one grader's source against another's, measured in one run:

    python benchmarks/throughput_before_after.py --before /tmp/before --after /tmp/after \\
        --count 115 --jobs 2 --rounds 2

``--before`` and ``--after`` are source trees of moco_ref (e.g. ``git worktree add /tmp/before
COMMIT``), each run as ``python -m moco_ref.cli grade CLASS -j N --out FRESH`` with that tree
first on ``PYTHONPATH`` (checked: the run must import moco_ref from it), from a folder of its
own so the current folder puts neither tree on the path. The class is made once
(``make_class``: one folder per student, every file distinct, so no cache can help), and every
run writes to a fresh ``--out`` (each grades every submission). Runs alternate, the order
reversed each round (before, after, after, before, ...), so that load that drifts over the
run falls on both alike. Prints each run's wall time (the whole command) and what its
``summary.json`` says (its grading time, statuses), then per side the mean and the best;
``after / before`` is the ratio of the means (above 1: the after tree is slower).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_class import make_class  # noqa: E402


def _environment(root: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(root), env.get("PYTHONPATH", "")) if part)
    return env


def _imports_from(root: Path, workdir: Path) -> Path:
    """Where ``python`` run as the benchmark runs it imports moco_ref from."""
    found = subprocess.run(
        [sys.executable, "-c", "import moco_ref; print(moco_ref.__file__)"],
        env=_environment(root), cwd=workdir, capture_output=True, text=True, check=True)
    return Path(found.stdout.strip()).resolve().parent.parent


def _graded(out: Path) -> dict:
    """What the run's ``summary.json`` says: its own wall time of grading (the process's
    start-up not included), how many it graded, and how many of each status."""
    try:
        data = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    statuses: dict[str, int] = {}
    for row in data.get("submissions") or []:
        status = str(row.get("status"))
        statuses[status] = statuses.get(status, 0) + 1
    return {"grading_seconds": data.get("wall_seconds"), "graded": data.get("graded"),
            "statuses": dict(sorted(statuses.items()))}


def run_once(root: Path, folder: Path, out: Path, jobs: int, workdir: Path,
             extra: list[str]) -> tuple[float, int, dict]:
    command = [sys.executable, "-m", "moco_ref.cli", "grade", str(folder), "-j", str(jobs),
               "--out", str(out), *extra]
    started = time.monotonic()
    done = subprocess.run(command, env=_environment(root), cwd=workdir,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.monotonic() - started
    if not out.is_dir():
        raise SystemExit(f"{root}: the run wrote nothing (exit {done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    return seconds, done.returncode, _graded(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a source tree of moco_ref")
    parser.add_argument("--after", type=Path, required=True, help="a source tree of moco_ref")
    parser.add_argument("--count", type=int, default=115, help="submissions in the class")
    parser.add_argument("--jobs", type=int, default=2, help="-j of each run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side")
    parser.add_argument("--warm-up", type=int, default=4, metavar="N",
                        help="an untimed run of each side over N submissions first (0: none);"
                             " a cold first run (page cache, compiling the tree's sources) "
                             "took 84 s where the same run took 30 s warm")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the class and the outputs go (default: a temporary folder)")
    parser.add_argument("grade_options", nargs="*",
                        help="more options for `moco-ref grade` (after --)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="moco-ref-throughput-"))
    work.mkdir(parents=True, exist_ok=True)
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    workdirs = {}
    for name, root in sides.items():
        workdirs[name] = work / f"cwd-{name}"
        workdirs[name].mkdir(exist_ok=True)
        found = _imports_from(root, workdirs[name])
        if found != root:
            raise SystemExit(f"--{name} {root}: python imports moco_ref from {found}")
        print(f"{name}: moco_ref from {found}", flush=True)
    folder = work / "class"
    made = make_class(folder, args.count)
    print(f"{len(made)} submissions in {folder}; -j {args.jobs}; {args.rounds} rounds", flush=True)
    if args.warm_up:
        warm = work / "warm-up-class"
        make_class(warm, min(args.warm_up, args.count))
        for name in sides:
            run_once(sides[name], warm, work / f"warm-up-{name}", args.jobs, workdirs[name],
                     args.grade_options)
        print(f"warmed up: each side graded {min(args.warm_up, args.count)} untimed",
              flush=True)
    times: dict[str, list[float]] = {name: [] for name in sides}
    grading: dict[str, list[float]] = {name: [] for name in sides}
    for round_number in range(args.rounds):
        order = list(sides) if round_number % 2 == 0 else list(reversed(list(sides)))
        for name in order:
            out = work / f"out-{name}-{round_number}"
            seconds, code, counts = run_once(sides[name], folder, out, args.jobs,
                                             workdirs[name], args.grade_options)
            times[name].append(seconds)
            if isinstance(counts.get("grading_seconds"), (int, float)):
                grading[name].append(float(counts["grading_seconds"]))
            print(f"round {round_number + 1} {name:6s} {seconds:8.1f} s  exit {code}  "
                  f"{json.dumps(counts)}", flush=True)
    for name, values in times.items():
        print(f"{name:6s} mean {statistics.mean(values):8.1f} s  best {min(values):8.1f} s  "
              f"({len(made) / statistics.mean(values):.2f} submissions/s)")
    ratio = statistics.mean(times["after"]) / statistics.mean(times["before"])
    best = min(times["after"]) / min(times["before"])
    print(f"after / before: {ratio:.3f} (means), {best:.3f} (best runs)")
    if all(grading.values()):
        inner = statistics.mean(grading["after"]) / statistics.mean(grading["before"])
        print(f"after / before, the summaries' grading time: {inner:.3f} (means: "
              f"{statistics.mean(grading['before']):.1f} s, "
              f"{statistics.mean(grading['after']):.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
