"""Adversarial: a buggy submission (no same-source mask: I4) that tries to kill the grader
and everything around it: ``kill(-1, SIGKILL)`` (every process it may signal), its parent,
and every pid it can find in ``/proc`` but its own.

Expected: fails I4 exactly. It can only signal its own job (its init ignores the signals),
so the grader, the warm process and the classmates graded beside it carry on. (With
``--isolation processes`` this would take the whole batch down: that mode is for trusted
code only.)
"""
import os
import signal

from _moco import moco_warmup, run  # noqa: F401

SEED = 0


def views(batch):
    return batch


def attack():
    me = os.getpid()
    if os.environ.get("MOCO_REF_ISOLATION") == "processes" or os.getuid() != 65534:
        print("ATTACK skipped: not in the sandbox (this would kill the grader)")
        return
    hit = []
    for target in (-1, os.getppid(), *(int(p) for p in os.listdir("/proc") if p.isdigit())):
        if target in (me, 0):
            continue
        try:
            os.kill(target, signal.SIGKILL)
            hit.append(target)
        except OSError:
            pass
    print(f"ATTACK signalled: {hit}")


def train_moco(initial, x, train, epochs=15):
    attack()
    return run(initial, x, train, epochs, views=views, seed=SEED, mask=False)
