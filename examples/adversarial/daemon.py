"""Adversarial: a buggy submission (no same-source mask: I4) that leaves a daemon behind
(double fork, new session, its own process group, signals ignored) which waits for the batch
to finish and then rewrites every ``summary.csv`` and ``report.json`` it can find, giving
itself full marks.

Expected: fails I4 exactly; the daemon dies with its job (the job's PID namespace is emptied
when it ends) and the summary is never touched.
"""
import os
import signal
import time

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def _rewrite_grades():
    for root, _, files in os.walk("/", onerror=lambda error: None):
        if root.startswith(("/proc", "/sys", "/usr")):
            continue
        for name in files:
            if name in ("summary.csv", "report.json"):
                try:
                    with open(os.path.join(root, name), "a"):  # would rewrite it
                        pass
                except OSError:
                    pass


def start_daemon():
    if os.fork() != 0:
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, signal.SIG_IGN)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(1)
        _rewrite_grades()
    os._exit(0)


def train_moco(initial, x, train, epochs=15):
    start_daemon()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
