"""The peak memory of one grading, summed over its whole process tree (issue 27, item 3).

    python benchmarks/memory_peak.py [--interval 0.05] [--json] [-- COMMAND ...]

runs ``COMMAND`` (default: ``moco-ref grade examples/submissions/correct_lab_order.py``, with
``--isolation bwrap``) and, every ``--interval`` seconds, adds up the proportional set size
(``Pss`` of ``/proc/PID/smaps_rollup``) of the command's process and all its descendants —
found by walking the ``ppid`` links of ``/proc/*/stat``, so the sandbox's processes (bwrap's
descendants: the warm zygote, the job's supervisor, init and worker) count too. Run as root to
read the sandbox's processes (they run as another host uid). It prints the peak and, for the
sample that held it, each process's PSS split into anonymous, file-backed and shared-memory
pages. Pages two processes of the tree share (the zygote and the job it forked) count once
over the tree, which is what the platform's memory box charges.

``measure(argv)`` does the same for the benchmark (``benchmarks/test_memory_peak.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TARGET = ROOT / "examples" / "submissions" / "correct_lab_order.py"
FIELDS = {b"Pss:": "pss", b"Pss_Anon:": "anon", b"Pss_File:": "file", b"Pss_Shmem:": "shmem",
          b"Private_Clean:": "private", b"Private_Dirty:": "private"}
MB = 2**20


@dataclass
class Process:
    pid: int
    name: str
    pss: int = 0  # bytes
    anon: int = 0
    file: int = 0
    shmem: int = 0
    private: int = 0  # pages no other process maps (its unique set size)
    depth: int = 0


@dataclass
class Peak:
    total: int = 0  # bytes
    seconds: float = 0.0  # when, after the start
    processes: list[Process] = field(default_factory=list)
    samples: int = 0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (s, bytes, processes)
    wall_seconds: float = 0.0
    returncode: int | None = None
    output: str = ""

    @property
    def total_mb(self) -> float:
        return self.total / MB

    def as_dict(self) -> dict:
        return {"peak_mb": round(self.total_mb, 1), "at_seconds": round(self.seconds, 2),
                "samples": self.samples, "wall_seconds": round(self.wall_seconds, 1),
                "returncode": self.returncode,
                "processes": [{"pid": p.pid, "name": p.name, "depth": p.depth,
                               "pss_mb": round(p.pss / MB, 1), "anon_mb": round(p.anon / MB, 1),
                               "file_mb": round(p.file / MB, 1),
                               "shmem_mb": round(p.shmem / MB, 1),
                               "private_mb": round(p.private / MB, 1)}
                              for p in self.processes],
                "timeline_mb": [[round(t, 1), round(b / MB), n] for t, b, n in self.timeline]}


def _parents() -> dict[int, int]:
    """pid -> ppid for every process (``/proc/*/stat``; the name may hold spaces and ')')."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                text = handle.read()
        except OSError:
            continue
        fields = text[text.rfind(b")") + 2:].split()
        table[int(entry)] = int(fields[1])
    return table


def tree(root: int) -> list[tuple[int, int]]:
    """``(pid, depth)`` of ``root`` and its descendants, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [(root, 0)]
    while todo:
        pid, depth = todo.pop()
        found.append((pid, depth))
        todo.extend((child, depth + 1) for child in sorted(children.get(pid, ()), reverse=True))
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().split(b"\0")
    except OSError:
        return "?"
    words = [word.decode(errors="replace") for word in words if word]
    if not words:
        return "?"
    short = [os.path.basename(words[0])]
    for word in words[1:]:  # the module or script, e.g. "-m moco_ref.sandbox.zygote"
        if word.startswith("--") and len(short) > 1:
            break
        if word == "--":  # the launcher's plan and bwrap's options are long: skip to the end
            continue
        short.append(word if len(word) < 60 else word[:57] + "...")
        if len(short) >= 4:
            break
    return " ".join(short)


def sample(pid: int, depth: int = 0) -> Process | None:
    """The process's PSS split (None when it is gone or unreadable)."""
    process = Process(pid, "", depth=depth)
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                key = line.split(b" ", 1)[0]
                if key in FIELDS:
                    name = FIELDS[key]
                    setattr(process, name, getattr(process, name) + int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        return None
    return process


def measure(argv: list[str], *, interval: float = 0.05, env: dict | None = None,
            timeout: float = 900.0) -> Peak:
    """Run ``argv`` to its end and return the peak of its tree's summed PSS."""
    peak = Peak()
    names: dict[int, str] = {}
    started = time.monotonic()
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL) as child:
        os.set_blocking(child.stdout.fileno(), False)
        chunks = []
        while True:
            done = child.poll() is not None
            processes = [p for p in (sample(pid, depth) for pid, depth in tree(child.pid))
                         if p is not None]
            total = sum(p.pss for p in processes)
            peak.samples += 1
            peak.timeline.append((time.monotonic() - started, total, len(processes)))
            for p in processes:  # names are read once per pid (a zygote keeps its own)
                if p.pid not in names:
                    names[p.pid] = _name(p.pid)
                p.name = names[p.pid]
            if total > peak.total:
                peak.total, peak.processes = total, processes
                peak.seconds = time.monotonic() - started
            try:
                data = child.stdout.read()
                if data:
                    chunks.append(data)
            except (BlockingIOError, TypeError):
                pass
            if done:
                break
            if time.monotonic() - started > timeout:
                child.kill()
            time.sleep(interval)
        os.set_blocking(child.stdout.fileno(), True)
        chunks.append(child.stdout.read() or b"")
        peak.returncode = child.returncode
    peak.wall_seconds = time.monotonic() - started
    peak.output = b"".join(chunks).decode(errors="replace")
    return peak


def moco_ref() -> list[str]:
    """This interpreter's ``moco-ref`` command."""
    program = shutil.which("moco-ref", path=os.path.dirname(sys.executable))
    return [program] if program else [sys.executable, "-m", "moco_ref.cli"]


def grade_command(target: Path | str = DEFAULT_TARGET, *, isolation: str = "bwrap",
                  extra: tuple[str, ...] = ()) -> list[str]:
    """``moco-ref grade TARGET --isolation ISOLATION`` with this interpreter's moco-ref."""
    return [*moco_ref(), "grade", str(target), "--isolation", isolation, *extra]


def render(peak: Peak, *, timeline: bool = False) -> str:
    lines = [f"peak {peak.total_mb:.0f} MB PSS over the tree, at {peak.seconds:.1f} s of "
             f"{peak.wall_seconds:.1f} s ({peak.samples} samples; exit {peak.returncode})",
             f"{'pid':>7} {'pss':>7} {'anon':>7} {'file':>7} {'shmem':>6} {'private':>7}  "
             "process (MB; private: pages no other process maps)"]
    for p in peak.processes:
        lines.append(f"{p.pid:>7} {p.pss / MB:>7.1f} {p.anon / MB:>7.1f} {p.file / MB:>7.1f} "
                     f"{p.shmem / MB:>6.1f} {p.private / MB:>7.1f}  {'  ' * p.depth}{p.name}")
    if timeline and peak.timeline:
        step = max(1, len(peak.timeline) // 40)
        lines.append("timeline (s: MB/processes): " + ", ".join(
            f"{t:.1f}: {b / MB:.0f}/{n}" for t, b, n in peak.timeline[::step]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = []
    if "--" in argv:
        command = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(prog="python benchmarks/memory_peak.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", default=str(DEFAULT_TARGET),
                        help="the submission to grade (default %(default)s)")
    parser.add_argument("--isolation", default="bwrap", choices=("bwrap", "processes"))
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    parser.add_argument("--json", action="store_true", help="print the peak as JSON")
    parser.add_argument("--output", action="store_true", help="print the command's output too")
    parser.add_argument("--timeline", action="store_true", help="print the total over time too")
    args = parser.parse_args(argv)
    command = command or grade_command(args.target, isolation=args.isolation)
    peak = measure(command, interval=args.interval)
    if args.output:
        print(peak.output)
    print(json.dumps(peak.as_dict(), indent=2) if args.json
          else render(peak, timeline=args.timeline))
    return 0 if peak.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
