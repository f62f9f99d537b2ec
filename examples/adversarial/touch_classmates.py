"""Adversarial: a buggy submission (no same-source mask: I4) that goes after its classmates
and the grades: it reads the grader's command line and environment from ``/proc``, searches
the file system for other submissions (``*.py``/``*.ipynb`` defining ``train_moco``),
reports, summaries and cache entries (``report.json``, ``summary.csv``, ``.cache``), and
opens every one it finds for writing (to make classmates' code crash, set their reports to
0, forge its own to full marks). It proves the access and writes nothing, so that running
the corpus with ``--isolation processes`` damages nothing.

Expected: fails I4 exactly; it finds nothing but its own file, changes nothing, and in a
batch its classmates keep their marks in the summary, in their reports and on a cached
rerun (tests/sandbox/test_grading_adversarial.py grades it beside them).
"""
import os

from _moco import moco_warmup, run  # noqa: F401

SEED = 0
TARGETS = ("report.json", "summary.csv", "summary.json", "results.json", ".secret")
SKIP = ("/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin")


def views(batch):
    return batch


def _walk():
    for root, folders, files in os.walk("/", onerror=lambda error: None):
        if root.startswith(SKIP) or "site-packages" in root or "/lib/python" in root:
            folders[:] = []
            continue
        for name in files:
            yield os.path.join(root, name)


def attack():
    seen = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    seen.append(handle.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    grader = [line for line in seen if "moco-ref" in line and "grade" in line]
    found, changed = [], []
    for path in _walk():
        name = os.path.basename(path)
        interesting = name in TARGETS or "/.cache/" in path
        if not interesting and name.endswith((".py", ".ipynb")):
            try:
                with open(path, errors="replace") as handle:
                    interesting = "def train_moco" in handle.read(200_000)
            except OSError:
                continue
        if not interesting or path.endswith("touch_classmates.py"):
            continue
        found.append(path)
        try:
            with open(path, "a"):  # would append "raise SystemExit('sabotaged')"
                pass
            changed.append(path)
        except OSError:
            pass
    print(f"ATTACK grader command lines seen: {len(grader)}; classmates, reports or cache "
          f"entries found: {len(found)}; writable: {len(changed)}")


def train_moco(initial, x, train, epochs=15):
    attack()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
